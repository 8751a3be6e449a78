"""Compile mlxcel's CPU kernels into one extension of MLX primitives (``mlxcel_cpu_ext``).

The kernels: the quantized matmul (``qmm_kernel.c``, primitive in ``qmm_ext.cpp``), and
attention and SwiGLU (``attn_kernel.c``, primitives in ``attn_ext.cpp``); ``kernels.cpp``
makes them one Python module, so they share one build, one load and one thread pool.

The extension is built once per machine into the user cache, with the compiler the
BLAS shim uses, against the headers and library the installed ``mlx`` wheel ships and
the sources of ``nanobind`` (the binding library MLX itself is built with: an array
passed from Python reaches the primitive as MLX's own C++ type only when both sides
share nanobind's ABI, hence the pinned range in ``pyproject.toml``).

The kernels are compiled for one instruction set, chosen here from the CPU's flags:
``avx512`` (F, BW, VL with BMI2 and FMA), else ``avx2`` (with FMA, BMI2 and F16C).
A CPU with neither gets no build and the model keeps MLX's own operations.
``MLXCEL_CPU_ISA`` (or its older name ``MLXCEL_QMM_ISA``) forces ``avx512``, ``avx2`` or
``generic`` (plain C, for tests), or ``off``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import subprocess
import sysconfig
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from mlxcel.config import cache_dir
from mlxcel.model.native.build import find_compiler

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
KERNELS = (HERE / "qmm_kernel.c", HERE / "attn_kernel.c", HERE / "pool.c")
BINDINGS = (HERE / "kernels.cpp", HERE / "qmm_ext.cpp", HERE / "attn_ext.cpp")
SOURCES = (
    *KERNELS,
    *BINDINGS,
    *(HERE / h for h in ("qmm_kernel.h", "attn_kernel.h", "simd.h", "pool.h")),
)
MODULE = "mlxcel_cpu_ext"
"""The extension's module name (``NB_MODULE`` in ``kernels.cpp``)."""
ISA_VARIABLES = ("MLXCEL_CPU_ISA", "MLXCEL_QMM_ISA")
"""The environment variables that force an instruction set, the first set one winning."""

#: Compiler flags per instruction set, and the CPU flags each needs.
ISA_FLAGS: dict[str, tuple[str, ...]] = {
    "avx512": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mbmi2", "-mfma", "-mf16c"),
    "avx2": ("-mavx2", "-mfma", "-mbmi2", "-mf16c"),
    "generic": (),
}
ISA_NEEDS: dict[str, frozenset[str]] = {
    "avx512": frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "bmi2", "fma", "f16c"}),
    "avx2": frozenset({"avx2", "fma", "bmi2", "f16c"}),
}


def compile_flags(isa: str, flags: frozenset[str] | None = None) -> tuple[str, ...]:
    """The kernels' flags for ``isa``; AVX-512 adds VBMI's byte shifts where the CPU has them."""
    have = cpu_flags() if flags is None else flags
    extra = ("-mavx512vbmi",) if isa == "avx512" and "avx512vbmi" in have else ()
    return ISA_FLAGS[isa] + extra


class CpuExtBuildError(RuntimeError):
    """The extension could not be built; the model keeps MLX's own operations."""


@dataclass(frozen=True)
class CpuExtBuild:
    """A built extension: where it is and which instruction set its kernels use."""

    path: Path
    isa: str


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as the kernel names them (empty where unknown)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def choose_isa(flags: frozenset[str] | None = None) -> str | None:
    """The instruction set to build for, or None for none (keep MLX's own path)."""
    for variable in ISA_VARIABLES:
        forced = os.environ.get(variable, "").strip().lower()
        if forced in ("off", "none"):
            return None
        if forced:
            if forced not in ISA_FLAGS:
                raise CpuExtBuildError(
                    f"{variable}={forced!r}: expected one of {sorted(ISA_FLAGS)} or off"
                )
            return forced
    have = cpu_flags() if flags is None else flags
    for isa in ("avx512", "avx2"):
        if ISA_NEEDS[isa] <= have:
            return isa
    return None


def _nanobind_root() -> Path:
    spec = importlib.util.find_spec("nanobind")
    if spec is None or spec.origin is None:
        raise CpuExtBuildError("the nanobind package is not installed")
    return Path(spec.origin).parent


def _mlx_root() -> Path:
    import mlx.core

    return Path(mlx.core.__file__).parent  # the wheel's root: include/, lib/


def _digest(isa: str) -> str:
    h = hashlib.sha256()
    for source in SOURCES:
        h.update(source.read_bytes())
    for dist in ("mlx", "nanobind"):
        try:
            h.update(f"{dist}={metadata.version(dist)};".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist}=?;".encode())
    h.update(f"{compile_flags(isa)};{sysconfig.get_config_var('EXT_SUFFIX')}".encode())
    return h.hexdigest()[:16]


def built_path(isa: str, root: Path | None = None) -> Path:
    """Where the extension for ``isa`` lives in the cache (built or not)."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    base = root if root is not None else cache_dir() / "cpu_ext"
    return base / f"{isa}-{_digest(isa)}" / f"{MODULE}{suffix}"


def build(isa: str, root: Path | None = None) -> CpuExtBuild:
    """Build the extension for ``isa`` into the cache, once; returns where it is.

    Compilation writes to a private temporary directory and renames the result into
    place, so processes starting together never load a half-written file.
    """
    target = built_path(isa, root)
    if target.exists():
        return CpuExtBuild(target, isa)
    nb, mlx_root = _nanobind_root(), _mlx_root()
    cc = find_compiler()
    cxx = os.environ.get("CXX") or _cxx_for(cc)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=target.parent) as tmp:
        objects = []
        for kernel in KERNELS:
            obj = Path(tmp) / f"{kernel.stem}.o"
            run_compiler(
                [cc, "-O3", "-std=c11", "-fPIC", "-pthread", *compile_flags(isa), "-c",
                 str(kernel), "-o", str(obj)],
                what=f"CPU kernel {kernel.name}",
            )  # fmt: skip
            objects.append(str(obj))
        out = Path(tmp) / target.name
        lib_dir = mlx_root / "lib"
        run_compiler(
            [cxx, "-O2", "-std=c++20", "-fPIC", "-shared", "-pthread", "-fvisibility=hidden",
             "-DNB_DOMAIN=mlx", "-DNDEBUG", f"-I{sysconfig.get_paths()['include']}",
             f"-I{nb / 'include'}", f"-I{nb / 'ext' / 'robin_map' / 'include'}",
             f"-I{mlx_root / 'include'}", f"-I{HERE}", *(str(b) for b in BINDINGS),
             str(nb / "src" / "nb_combined.cpp"), *objects, f"-L{lib_dir}", "-lmlx",
             f"-Wl,-rpath,{lib_dir}", "-o", str(out)],
            what="CPU kernels extension",
            timeout=600,
        )  # fmt: skip
        os.replace(out, target)
    log.info("Built the CPU kernels extension (%s) in %s", isa, target)
    return CpuExtBuild(target, isa)


def run_compiler(cmd: list[str], *, what: str, timeout: float = 300) -> None:
    """Run one compiler command; a failure raises with the compiler's first lines of error."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CpuExtBuildError(f"{what}: {exc}") from exc
    if proc.returncode != 0:
        raise CpuExtBuildError(f"{what} did not compile: {proc.stderr.strip()[:800]}")


def _cxx_for(cc: str) -> str:
    """The C++ driver beside the C compiler ``cc`` (gcc -> g++, clang -> clang++)."""
    path = Path(cc)
    for c_name, cxx_name in (("gcc", "g++"), ("clang", "clang++"), ("cc", "c++")):
        if path.name.startswith(c_name):
            candidate = path.with_name(path.name.replace(c_name, cxx_name, 1))
            if candidate.exists():
                return str(candidate)
    return "c++"
