"""The llama.cpp peer's build options come from /proc/cpuinfo: each instruction set as the
CPU reports it, AVX-512's extensions only with AVX-512 itself, AMX only when asked for and
the OS grants the tile state, and one cache folder per set of options; the benchmark runs
the last build made while this CPU runs it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_llama_server", BENCH / "llama_server.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


llama_server = _load()

AVX2_ONLY = "fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c bmi1 avx2 bmi2"
AVX512 = "avx512f avx512dq avx512cd avx512bw avx512vl"
SAPPHIRE_RAPIDS = (
    f"{AVX2_ONLY} {AVX512} avx_vnni avx512_bf16 avx512vbmi avx512_vnni "
    "amx_bf16 avx512_fp16 amx_tile amx_int8"
)
ZEN4 = f"{AVX2_ONLY} {AVX512} avx512vbmi avx512_vnni avx512_bf16"


def cpuinfo(flags: str, processors: int = 2) -> str:
    block = "processor\t: {n}\nvendor_id\t: GenuineIntel\nmodel name\t: Test CPU\nflags\t\t: {f}\n"
    # Only the first processor's flags count; later blocks could differ (hybrid CPUs).
    blocks = [
        block.format(n=0, f=flags),
        *(block.format(n=n, f="fpu") for n in range(1, processors)),
    ]
    return "\n".join(blocks)


def on(flags: dict[str, bool]) -> set[str]:
    return {name for name, value in flags.items() if value}


def test_amx_is_built_only_when_asked_for_and_the_os_grants_it() -> None:
    text = cpuinfo(SAPPHIRE_RAPIDS)
    granted = llama_server.choose_flags(text, amx_granted=True, amx=True)
    refused = llama_server.choose_flags(text, amx_granted=False, amx=True)
    default = llama_server.choose_flags(text, amx_granted=True)
    amx = {"GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"}
    assert amx <= on(granted)
    assert not amx & on(refused)
    assert not amx & on(default)
    assert on(granted) - amx == on(refused) == on(default)
    assert {"GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX512_BF16", "GGML_AVX512_VBMI"} <= on(
        refused
    )


def test_avx512_without_amx_and_avx2_only_cpus() -> None:
    zen4 = llama_server.choose_flags(cpuinfo(ZEN4), amx_granted=True, amx=True)
    assert on(zen4) == {
        "GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2", "GGML_AVX512",
        "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16",
    }  # fmt: skip
    haswell = llama_server.choose_flags(cpuinfo(AVX2_ONLY), amx_granted=True, amx=True)
    assert on(haswell) == {"GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2"}
    # Every option is passed, on or off, so cmake's own defaults never decide.
    assert set(haswell) == set(zen4)


def test_avx512_extensions_need_the_whole_avx512_base() -> None:
    partial = AVX2_ONLY + " avx512f avx512vl avx512_vnni avx512_bf16 amx_tile amx_int8"
    flags = llama_server.choose_flags(cpuinfo(partial), amx_granted=True, amx=True)
    assert not {name for name in on(flags) if "AVX512" in name or "AMX" in name}


def test_cpuinfo_is_read_from_the_first_processor() -> None:
    text = cpuinfo(SAPPHIRE_RAPIDS, processors=3)
    assert llama_server.cpu_model(text) == "Test CPU"
    assert "amx_tile" in llama_server.cpu_flags(text)
    assert llama_server.choose_flags("", amx_granted=True) == dict.fromkeys(
        llama_server.choose_flags(text, amx_granted=True), False
    )


def test_options_and_cache_folder_follow_the_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLXCEL_CACHE_DIR", str(tmp_path))
    with_amx = llama_server.choose_flags(cpuinfo(SAPPHIRE_RAPIDS), amx_granted=True, amx=True)
    without = llama_server.choose_flags(cpuinfo(SAPPHIRE_RAPIDS), amx_granted=True)
    options = llama_server.cmake_options(with_amx)
    assert "-DGGML_NATIVE=OFF" in options
    assert "-DGGML_AMX_INT8=ON" in options
    assert "-DGGML_AMX_INT8=OFF" in llama_server.cmake_options(without)
    folder = llama_server.build_dir("0.3.36", with_amx)
    assert folder.parent == tmp_path / "llama-server"
    assert folder == llama_server.build_dir("0.3.36", dict(with_amx))
    assert folder != llama_server.build_dir("0.3.36", without)
    assert folder != llama_server.build_dir("0.3.37", with_amx)
    assert llama_server.flags_summary(without).split()[:3] == ["AVX", "AVX2", "FMA"]


def _fake_build(flags: dict[str, bool]) -> Path:
    folder = llama_server.build_dir("0.3.36", flags)
    folder.mkdir(parents=True)
    (folder / "llama-server").write_text("")
    record = {"llama_cpp_python": "0.3.36", "cmake_options": llama_server.cmake_options(flags)}
    (folder / "build.json").write_text(json.dumps(record))
    return folder


def test_the_benchmark_runs_the_last_build_this_cpu_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLXCEL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(llama_server, "read_cpuinfo", lambda: cpuinfo(SAPPHIRE_RAPIDS))
    monkeypatch.setattr(llama_server, "amx_granted", lambda: True)
    text = cpuinfo(SAPPHIRE_RAPIDS)
    assert llama_server.cached_build("0.3.36") is None
    default = _fake_build(llama_server.choose_flags(text, amx_granted=True))
    with_amx = _fake_build(llama_server.choose_flags(text, amx_granted=True, amx=True))
    assert llama_server.cached_build("0.3.36")[0].parent == default  # nothing named yet
    llama_server._make_current(with_amx)
    assert llama_server.cached_build("0.3.36")[0].parent == with_amx
    assert llama_server.cached_build("0.3.37") is None  # another release: not this build
    monkeypatch.setattr(llama_server, "amx_granted", lambda: False)
    assert llama_server.cached_build("0.3.36")[0].parent == default  # AMX no longer runs
