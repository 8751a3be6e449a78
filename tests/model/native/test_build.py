"""The one build of the native code: the CPU probe, the instruction set chosen (and forced,
and refused), the compilers, and one cached file per build of each library."""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path

import pytest

from mlxcel.model.native import build

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the native code is built on Linux"
)

CPUINFO = """processor\t: 0
vendor_id\t: {vendor}
model name\t: {model}
flags\t\t: fpu sse sse2 {extra}
bogomips\t: 5199.99

processor\t: 1
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse sse2 avx512f avx2 fma
"""
AVX2 = "avx avx2 fma bmi2 f16c"
AVX512 = f"{AVX2} avx512f avx512bw avx512vl avx512dq"
SAPPHIRE_RAPIDS = f"{AVX512} avx512vbmi avx512_vnni avx512_bf16 amx_tile amx_bf16 amx_int8"
ZEN4 = f"{AVX512} avx512vbmi avx512_vnni avx512_bf16"


def cpu(extra: str, vendor: str = "GenuineIntel", model: str = "A CPU") -> build.Cpu:
    return build.probe(CPUINFO.format(extra=extra, vendor=vendor, model=model))


@pytest.fixture(autouse=True)
def no_forcing(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in build.ISA_VARIABLES:
        monkeypatch.delenv(variable, raising=False)


@pytest.mark.parametrize(
    ("extra", "isa", "vbmi", "amx"),
    [
        (SAPPHIRE_RAPIDS, "avx512", True, True),  # Intel with AMX
        (ZEN4, "avx512", True, False),  # AMD: AVX-512 with VNNI and BF16, no AMX
        (AVX512, "avx512", False, False),  # Skylake-X: no VBMI
        (f"{AVX2} avx512f", "avx2", False, False),  # AVX-512 F alone: not simd.h's
        (AVX2, "avx2", False, False),
        ("avx avx2 fma", "generic", False, False),  # the kernels need BMI2 and F16C too
        ("", "generic", False, False),
        (f"{AVX2} amx_tile amx_bf16", "avx2", False, False),  # tiles without VBMI: unused
    ],
)
def test_the_probe_reads_the_first_processor(extra: str, isa: str, vbmi: bool, amx: bool) -> None:
    found = cpu(extra, model="Intel(R) Xeon(R) Platinum")
    assert (found.isa, found.vbmi, found.amx) == (isa, vbmi, amx)
    assert found.vendor == "GenuineIntel"
    assert found.describe().startswith(f"Intel(R) Xeon(R) Platinum ({isa}")


def test_avx512_gains_vbmi_where_the_cpu_has_it() -> None:
    assert build.compile_flags("avx512", cpu(ZEN4))[-1] == build.VBMI_FLAG
    assert build.VBMI_FLAG not in build.compile_flags("avx512", cpu(AVX512))
    assert build.compile_flags("generic", cpu(ZEN4)) == ()


def test_one_variable_and_its_older_names_force_a_build(monkeypatch: pytest.MonkeyPatch) -> None:
    wide = cpu(SAPPHIRE_RAPIDS)
    assert build.chosen_isa(wide) == "avx512"
    assert build.kernels_isa(cpu(AVX2)) == "avx2"
    assert build.kernels_isa(cpu("")) is None  # plain C kernels only when asked for
    monkeypatch.setenv("MLXCEL_BLAS_ISA", " AVX2 ")
    assert build.chosen_isa(wide) == "avx2"
    monkeypatch.setenv("MLXCEL_QMM_ISA", "generic")  # the newer name wins over the older
    assert build.chosen_isa(wide) == "generic"
    assert build.kernels_isa(wide) == "generic"
    monkeypatch.setenv("MLXCEL_CPU_ISA", "off")
    assert build.kernels_isa(wide) is None
    assert build.chosen_isa(wide) == "avx512"  # the shim keeps the CPU's build


def test_a_build_the_cpu_cannot_run_or_an_unknown_name_is_refused(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MLXCEL_CPU_ISA", "avx512")
    with caplog.at_level(logging.WARNING, logger="mlxcel.model.native.build"):
        assert build.chosen_isa(cpu(AVX2)) == "avx2"  # not a crash on its first product
        assert build.kernels_isa(cpu("")) is None
    assert "this CPU runs avx2 at most" in caplog.text
    unknown = build.Cpu("", "", frozenset(), known=False)
    assert build.chosen_isa(unknown) == "avx512"  # flags unread: the variable is trusted
    monkeypatch.setenv("MLXCEL_CPU_ISA", "sse9")
    with caplog.at_level(logging.WARNING, logger="mlxcel.model.native.build"):
        assert build.chosen_isa(cpu(AVX2)) == "avx2"
    assert "MLXCEL_CPU_ISA='sse9' is not one of avx512, avx2, generic or off" in caplog.text


def test_the_compilers_are_found_or_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("CC", "gcc")
    tools = build.compilers()
    assert Path(tools.cc).name == "gcc"
    assert Path(tools.cxx).name == "g++"
    monkeypatch.setenv("CXX", "clang++")
    assert build.compilers().cxx == "clang++"
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    with pytest.raises(build.NativeBuildError, match="no C compiler"):
        build.compilers()


def _openblas() -> Path:
    mod = importlib.import_module("scipy_openblas32")
    return Path(mod.get_lib_dir()) / mod.get_library(fullname=True)


def test_each_build_has_its_own_cached_file(tmp_path: Path) -> None:
    detected = build.chosen_isa()
    generic = build.build_shim(_openblas(), "generic", tmp_path)
    wide = build.build_shim(_openblas(), detected, tmp_path)
    assert generic.name.startswith("mlxcel-blas-shim-generic-")
    assert wide.name.startswith(f"mlxcel-blas-shim-{detected}-")
    assert (generic == wide) == (detected == "generic")
    stamp = generic.stat().st_mtime_ns
    assert build.build_shim(_openblas(), "generic", tmp_path) == generic
    assert generic.stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert sorted(tmp_path.iterdir()) == sorted({generic, wide})  # no temporary files


def test_the_name_changes_with_what_shapes_the_binary() -> None:
    recipe = build.shim_recipe(_openblas())
    names = {
        build._digest(recipe, build.ISAS[isa].flags, build.Compilers(cc, cc))
        for isa in build.ISAS
        for cc in ("/usr/bin/gcc", "/usr/bin/clang")
    }
    assert len(names) == 2 * len(build.ISAS)


def test_a_failed_build_raises_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    with pytest.raises(build.NativeBuildError, match="did not compile"):
        build.build_shim(_openblas(), out_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(build.chosen_isa() == "generic", reason="this CPU gets the generic build")
def test_a_compiler_that_cannot_target_the_cpus_set_gets_the_generic_shim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiler = tmp_path / "cc-without-vectors"
    compiler.write_text(
        '#!/bin/sh\ncase "$*" in *-mavx*) echo "no such target" >&2; exit 1;; esac\nexec gcc "$@"\n'
    )
    compiler.chmod(0o755)
    monkeypatch.setenv("CC", str(compiler))
    shim = build.build_shim(_openblas(), out_dir=tmp_path / "out")
    assert shim.name.startswith("mlxcel-blas-shim-generic-")
    monkeypatch.setenv("MLXCEL_CPU_ISA", build.chosen_isa())  # asked for: no fallback
    with pytest.raises(build.NativeBuildError, match="no such target"):
        build.build_shim(_openblas(), out_dir=tmp_path / "out")


def test_the_native_builds_go_to_the_user_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLXCEL_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert build.native_dir() == tmp_path / "mlxcel" / "native"
