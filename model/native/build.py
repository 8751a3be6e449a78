"""Compile the BLAS shim (``blas_shim.c`` and its kernel) for this machine.

The shim's skinny float32 kernel is written once with GCC vector extensions
and compiled for the widest instruction set the CPU has: AVX-512 (F, BW, VL), else
AVX2 with FMA, else the compiler's baseline ("generic"). The choice is made
here at build time, not at run time, so the kernel needs no dispatch code;
the price is one build per instruction set, each under its own cache name.

Environment:

``MLXCEL_BLAS_ISA``
    ``avx512``, ``avx2`` or ``generic`` forces that build (for tests, and for
    machines whose ``/proc/cpuinfo`` misleads). A build for an instruction
    set the CPU lacks dies with SIGILL on its first skinny product.
``CC``
    C compiler (default ``cc``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

#: The loader accepts only a shim reporting this version (see blas_shim.c).
SHIM_VERSION = 3

_HERE = Path(__file__).parent
SOURCES = ("blas_shim.c", "blas_skinny.c", "pool.c")
HEADERS = ("blas_shim.h", "simd.h", "pool.h")

#: Compiler flags per instruction set, widest first.
ISA_FLAGS: dict[str, tuple[str, ...]] = {
    "avx512": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma"),
    "avx2": ("-mavx2", "-mfma"),
    "generic": (),
}
_BASE_FLAGS = (
    "-O3", "-pthread", "-shared", "-fPIC", "-fvisibility=hidden", "-DMLXCEL_POOL_OWNER",
)  # fmt: skip


class ShimBuildError(RuntimeError):
    """The shim could not be compiled."""


def cpu_isa(cpuinfo: str | None = None) -> str:
    """The widest instruction set in ``ISA_FLAGS`` this CPU supports.

    Reads the ``flags`` line of ``/proc/cpuinfo`` (or ``cpuinfo`` when
    given); anything but x86-64 gets the generic build.
    """
    if cpuinfo is None:
        if platform.machine().lower() not in ("x86_64", "amd64"):
            return "generic"
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return "generic"
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags = set(value.split())
            break
    if {"avx512f", "avx512bw", "avx512vl", "fma"} <= flags:  # simd.h's AVX-512
        return "avx512"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return "generic"


def chosen_isa() -> str:
    """``MLXCEL_BLAS_ISA`` when set to a known name, else :func:`cpu_isa`."""
    forced = os.environ.get("MLXCEL_BLAS_ISA", "").strip().lower()
    if forced in ISA_FLAGS:
        return forced
    if forced:
        log.warning("MLXCEL_BLAS_ISA=%s is not one of %s; detecting", forced, list(ISA_FLAGS))
    return cpu_isa()


def shim_name(openblas: Path, isa: str, compiler: str) -> str:
    """Cache file name: a hash of everything that shapes the binary.

    Sources, flags, compiler and the OpenBLAS path all go in, so an edited
    kernel, another instruction set or an upgraded venv gets a fresh file
    instead of a stale one.
    """
    digest = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        digest.update(name.encode() + b"\0" + (_HERE / name).read_bytes() + b"\0")
    for part in (*_BASE_FLAGS, *ISA_FLAGS[isa], compiler, str(openblas.resolve())):
        digest.update(part.encode() + b"\0")
    return f"mlxcel-blas-shim-{isa}-{digest.hexdigest()[:16]}.so"


def build(openblas: Path, out_dir: Path, isa: str) -> Path:
    """Compile the shim for ``openblas`` and ``isa`` into ``out_dir``, once.

    Compilation writes to a private temporary name and renames it into
    place, so processes starting concurrently never load a half-written file.
    """
    if isa not in ISA_FLAGS:
        raise ShimBuildError(f"unknown instruction set {isa!r}")
    compiler = find_compiler()
    target = out_dir / shim_name(openblas, isa, compiler)
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=out_dir)
    os.close(fd)
    tmp = Path(tmp_name)
    lib = openblas.resolve()
    cmd = [
        compiler, *_BASE_FLAGS, *ISA_FLAGS[isa], "-o", str(tmp),
        *(str(_HERE / name) for name in SOURCES),
        str(lib), f"-Wl,-rpath,{lib.parent}",
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)
        if proc.returncode != 0:
            raise ShimBuildError(f"shim build ({isa}) failed: {proc.stderr.strip()[:500]}")
        tmp.chmod(0o755)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    log.info("Built BLAS shim %s", target)
    return target


def build_best(openblas: Path, out_dir: Path) -> Path:
    """The shim for :func:`chosen_isa`; a compiler that cannot target a
    detected (not forced) instruction set gets the generic build instead."""
    isa = chosen_isa()
    try:
        return build(openblas, out_dir, isa)
    except ShimBuildError as exc:
        if isa == "generic" or os.environ.get("MLXCEL_BLAS_ISA"):
            raise
        log.warning("%s; building the generic kernel", exc)
        return build(openblas, out_dir, "generic")


def find_compiler() -> str:
    """``$CC``, else the first of cc, gcc, clang on ``PATH``."""
    for name in (os.environ.get("CC", ""), "cc", "gcc", "clang"):
        if name and (found := shutil.which(name)):
            return found
    raise ShimBuildError("no C compiler (cc, gcc or clang) to build the BLAS shim")
