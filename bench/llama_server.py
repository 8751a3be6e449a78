"""Build llama.cpp's own `llama-server` for the serving benchmark's llama.cpp row, once.

    .venv/bin/python bench/llama_server.py build          # build (or find) it; print where and how
    .venv/bin/python bench/llama_server.py build --amx    # with AMX (see below)
    .venv/bin/python bench/llama_server.py where          # the build the benchmark runs

The source is the llama.cpp that llama-cpp-python's sdist vendors, at the release pinned
below, so the peer is a known llama.cpp and comes from the package registry like every
other dependency: `pip download --no-binary :all: --no-deps` fetches the sdist, and cmake
builds the one target `llama-server` (Release, static libraries, no network code, no web
UI) on two jobs.

The instruction sets are chosen here from `/proc/cpuinfo`, never by the compiler's
`-march=native` (`GGML_NATIVE=OFF`): AVX, AVX2, FMA, F16C, BMI2, AVX-VNNI and AVX-512 (F with
CD, VL, DQ and BW; VBMI, VNNI, BF16) as the CPU reports them. AMX (tile, INT8, BF16) only
with `--amx`, and then only when the CPU reports it and Linux grants this process the tile
state (`arch_prctl(ARCH_REQ_XCOMP_PERM)`, the request our quantized matmul makes before its
AMX path); why not by default: AMX_NOTE.

The binary is kept in `cache_dir()/llama-server/<release>-<hash of the options>/`, with
`build.json` beside it (release, flags, cmake options, CPU); a second run with the same
options finds it and builds nothing. `current.json` there names the build made or found
last, which the benchmark runs (while this CPU can run it). cmake is the one on PATH, else
the `cmake` wheel of the `bench` extra.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

LLAMA_CPP_PYTHON = "0.3.36"
"""The llama-cpp-python release whose vendored llama.cpp is built (the flags and the
server options the benchmark passes were read from it)."""
BINARY = "llama-server"
JOBS = 2
AMX_NOTE = (
    "llama.cpp's AMX path in this release dies with SIGILL at its first matrix product when "
    "built by GCC 12, even where Linux grants the tile state: the compiler drops the stores "
    "that fill its tile configuration (a stack struct only ldtilecfg reads), so its tiles "
    "stay unconfigured"
)
"""Why the default build leaves AMX out (seen in the disassembly of a build made here)."""

# (cmake option, the /proc/cpuinfo flags it needs), in ggml's order.
BASE_FLAGS: tuple[tuple[str, frozenset[str]], ...] = (
    ("GGML_AVX", frozenset({"avx"})),
    ("GGML_AVX2", frozenset({"avx2"})),
    ("GGML_FMA", frozenset({"fma"})),
    ("GGML_F16C", frozenset({"f16c"})),
    ("GGML_BMI2", frozenset({"bmi2"})),
    ("GGML_AVX_VNNI", frozenset({"avx_vnni"})),
    # ggml's AVX512 switch compiles with -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw
    ("GGML_AVX512", frozenset({"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"})),
)
AVX512_EXTRAS: tuple[tuple[str, frozenset[str]], ...] = (
    ("GGML_AVX512_VBMI", frozenset({"avx512vbmi"})),
    ("GGML_AVX512_VNNI", frozenset({"avx512_vnni"})),
    ("GGML_AVX512_BF16", frozenset({"avx512_bf16"})),
)
AMX_FLAGS: tuple[tuple[str, frozenset[str]], ...] = (
    ("GGML_AMX_TILE", frozenset({"amx_tile"})),
    ("GGML_AMX_INT8", frozenset({"amx_int8"})),
    ("GGML_AMX_BF16", frozenset({"amx_bf16"})),
)
ALL_FLAGS = frozenset(name for name, _ in BASE_FLAGS + AVX512_EXTRAS + AMX_FLAGS)
FIXED_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",  # one self-contained file to cache
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",  # no HTTPS: it serves the loopback and downloads nothing
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # else the build would try to download the web UI
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)


class BuildError(RuntimeError):
    """llama-server could not be built; the message says which step failed."""


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The first processor's feature flags in a /proc/cpuinfo text."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def cpu_model(cpuinfo: str) -> str:
    """The first processor's model name in a /proc/cpuinfo text ('' when absent)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "model name":
            return value.strip()
    return ""


def choose_flags(cpuinfo: str, amx_granted: bool, amx: bool = False) -> dict[str, bool]:
    """Every ggml instruction-set option, on or off, for the CPU `cpuinfo` describes.

    AVX-512's extensions need AVX-512 itself. AMX is only built when asked for (`amx`; see
    AMX_NOTE), and then needs AVX-512 with VNNI (ggml's AMX code is compiled only with
    both) and the OS's grant as well as the CPU's flags."""
    flags = cpu_flags(cpuinfo)
    chosen = {name: needs <= flags for name, needs in BASE_FLAGS}
    for name, needs in AVX512_EXTRAS:
        chosen[name] = chosen["GGML_AVX512"] and needs <= flags
    amx_base = amx and chosen["GGML_AVX512_VNNI"] and amx_granted
    for name, needs in AMX_FLAGS:
        chosen[name] = amx_base and needs <= flags
    return chosen


def read_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return ""


def amx_granted() -> bool:
    """Whether Linux lets this process use the AMX tile data (XFEATURE_XTILEDATA, 18).

    The request is the one a program makes before its first tile instruction; it fails
    where the kernel (before 5.16) or the hypervisor does not enable the state."""
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata = 158, 0x1023, 18
    return int(libc.syscall(sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata)) == 0


def flags_summary(flags: dict[str, bool]) -> str:
    """The options that are on, short: 'AVX AVX2 FMA ... AMX_INT8' ('none' for none)."""
    on = [name.removeprefix("GGML_") for name, value in flags.items() if value]
    return " ".join(on) or "none"


def cmake_options(flags: dict[str, bool]) -> list[str]:
    return [*FIXED_OPTIONS, *(f"-D{name}={'ON' if on else 'OFF'}" for name, on in flags.items())]


def build_dir(version: str, flags: dict[str, bool]) -> Path:
    """Where the build for this release and these flags is kept."""
    key = json.dumps({"version": version, "options": cmake_options(flags)}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return _root() / f"{version}-{digest}"


def cached_build(version: str = LLAMA_CPP_PYTHON) -> tuple[Path, dict[str, Any]] | None:
    """The build the benchmark runs, when there is one: the binary and its build.json
    record. The one `current.json` names (the last made or found) when it is of this
    release and this CPU runs every instruction set it was built for; else the default
    build for this CPU."""
    cpuinfo, granted = read_cpuinfo(), amx_granted()
    runnable = choose_flags(cpuinfo, granted, amx=True)
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        name = json.loads((_root() / "current.json").read_text())["folder"]
        found = _load(_root() / str(name))
        same = found is not None and found[1]["llama_cpp_python"] == version
        if found is not None and same and all(runnable.get(f) for f in built_flags(found[1])):
            return found
    return _load(build_dir(version, choose_flags(cpuinfo, granted)))


def built_flags(record: dict[str, Any]) -> list[str]:
    """The instruction-set options a build.json record says were on."""
    options = (o.removeprefix("-D").split("=") for o in record["cmake_options"])
    return [name for name, value in options if name in ALL_FLAGS and value == "ON"]


def _root() -> Path:
    return Path(importlib.import_module("mlxcel.config").cache_dir()) / "llama-server"


def _make_current(folder: Path) -> None:
    """Name `folder` as the build the benchmark runs (written whole, then renamed)."""
    part = folder.parent / "current.json.part"
    part.write_text(json.dumps({"folder": folder.name}) + "\n")
    os.replace(part, folder.parent / "current.json")


def _load(folder: Path) -> tuple[Path, dict[str, Any]] | None:
    binary, record = folder / BINARY, folder / "build.json"
    if binary.is_file() and record.is_file():
        return binary, json.loads(record.read_text())
    return None


def find_cmake() -> str:
    """cmake on PATH, else the one the `cmake` wheel installs next to this interpreter."""
    found = shutil.which("cmake") or shutil.which("cmake", path=str(Path(sys.executable).parent))
    if found is None:
        raise BuildError(
            "cmake not found: install the bench extra (`pip install -e '.[bench]'`, which "
            "brings the cmake wheel) or `apt-get install -y cmake`"
        )
    return found


def _run(command: list[str], log: Path, step: str) -> None:
    print(f"{step}: {' '.join(command)}", flush=True)
    with log.open("ab") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise BuildError(f"{step} failed (exit {done.returncode}); log {log}:\n{tail}")


def download_source(version: str, work: Path, log: Path) -> Path:
    """The sdist from the package registry, unpacked; returns its vendored llama.cpp."""
    pip = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps"]
    _run([*pip, f"llama-cpp-python=={version}", "-d", str(work)], log, "download")
    archives = sorted(work.glob("llama_cpp_python-*.tar.gz"))
    if not archives:
        raise BuildError(f"pip download left no llama_cpp_python sdist in {work}")
    with tarfile.open(archives[0]) as archive:
        archive.extractall(work, filter="data")
    source = work / archives[0].name.removesuffix(".tar.gz") / "vendor" / "llama.cpp"
    if not (source / "CMakeLists.txt").is_file():
        raise BuildError(f"the sdist holds no vendored llama.cpp at {source}")
    return source


def build(version: str = LLAMA_CPP_PYTHON, amx: bool = False) -> tuple[Path, dict[str, Any]]:
    """The binary for this CPU, built unless it is already in the cache, and its record;
    from now on the one the benchmark runs."""
    cpuinfo, granted = read_cpuinfo(), amx_granted()
    flags = choose_flags(cpuinfo, granted, amx)
    folder = build_dir(version, flags)
    found = _load(folder) or _build(version, flags, folder, cpuinfo)
    _make_current(folder)
    return found


def _build(
    version: str, flags: dict[str, bool], folder: Path, cpuinfo: str
) -> tuple[Path, dict[str, Any]]:
    cmake = find_cmake()
    folder.parent.mkdir(parents=True, exist_ok=True)
    log = folder.parent / f"{folder.name}.log"
    log.write_text("")
    print(f"building {BINARY} of llama-cpp-python {version} (flags: {flags_summary(flags)}); "
          f"takes a while on few cores, log {log}", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix=f".{folder.name}.work-", dir=folder.parent) as tmp:
        work = Path(tmp)
        source = download_source(version, work, log)
        out = work / "build"
        _run([cmake, "-S", str(source), "-B", str(out), *cmake_options(flags)], log, "configure")
        _run([cmake, "--build", str(out), "--target", BINARY, "-j", str(JOBS)], log, "build")
        built = next(out.rglob(BINARY), None)
        if built is None:
            raise BuildError(f"the build finished but left no {BINARY} under {out}")
        staged = work / "staged"
        staged.mkdir()
        shutil.copy2(built, staged / BINARY)
        record = {
            "llama_cpp_python": version,
            "flags": flags_summary(flags),
            "cmake_options": cmake_options(flags),
            "cpu": cpu_model(cpuinfo),
        }
        (staged / "build.json").write_text(json.dumps(record, indent=2) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(staged, folder)  # the folder appears whole or not at all
    return folder / BINARY, record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["build", "where"], help="build it, or only look")
    parser.add_argument("--version", default=LLAMA_CPP_PYTHON, help="llama-cpp-python release")
    parser.add_argument("--amx", action="store_true", help="with AMX, if granted; see AMX_NOTE")
    args = parser.parse_args(argv)
    if args.amx and not amx_granted():
        print("note: Linux does not grant this process AMX's tile state: built without AMX")
    try:
        if args.action == "build":
            found: tuple[Path, dict[str, Any]] | None = build(args.version, args.amx)
        else:
            found = cached_build(args.version)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if found is None:
        print(f"not built yet: run `{sys.executable} bench/llama_server.py build`")
        return 1
    binary, record = found
    print(f"{binary}\nflags: {record['flags']}\ncmake: {' '.join(record['cmake_options'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
