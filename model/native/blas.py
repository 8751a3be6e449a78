"""Route MLX's CPU matrix products to a fast BLAS.

MLX's Linux CPU wheel links the netlib reference BLAS, whose float32 GEMM
runs at a few GFLOP/s; OpenBLAS on the same cores is 30-40x faster. MLX only
imports ``cblas_sgemm``, ``cblas_dgemm`` and ``cblas_cgemm``, and Python loads
extension modules with ``RTLD_LOCAL``, so a library that exports those names
and is loaded with ``RTLD_GLOBAL`` *before* ``mlx.core`` is imported wins the
symbol lookup. PyPI's ``scipy-openblas32`` prefixes every symbol with
``scipy_``, so a C shim (``blas_shim.c``) is compiled once per machine into
the user cache and forwards the standard names. The shim also sends the
skinny float32 products of decoding (a few activation rows times a weight
matrix) to its own kernel, which streams the weights once for all rows;
``build.py`` compiles it for the CPU's widest vector instructions.

Call :func:`load_fast_blas` first thing in every entry point. It never
raises: when nothing fast can be loaded it reports the reference BLAS and the
program keeps working, only slower.

Environment:

``MLXCEL_BLAS``
    ``reference`` keeps MLX's own BLAS; a path to a shared library forces
    that library (one exporting ``cblas_sgemm`` is loaded as is, one
    exporting ``scipy_cblas_sgemm`` gets the shim).
``MLXCEL_CACHE_DIR``
    Overrides the per-user cache directory (``mlxcel.config.cache_dir``); the
    shim is kept in its ``native`` folder.
``MLXCEL_CPU_ISA`` (older names ``MLXCEL_BLAS_ISA``, ``MLXCEL_QMM_ISA``)
    ``avx512``, ``avx2`` or ``generic``: the shim kernel's build, as the CPU
    kernels' (default: the CPU's widest; see ``build.py``).
``MLXCEL_CPU_THREADS`` (older name ``MLXCEL_BLAS_THREADS``)
    Threads of the shim's kernel, which runs on the pool the CPU kernels share
    (``pool.h``; default: ``OPENBLAS_NUM_THREADS``, which this module sets to the
    usable CPUs unless already set).
``MLXCEL_BLAS_SKINNY_MAX``
    Most activation rows the kernel takes before OpenBLAS's sgemm does
    (0 turns the kernel off; one row always goes to sgemv).
``CC``
    C compiler used for the shim (default ``cc``; see ``build.py``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import mlxcel.model.native.build as build

log = logging.getLogger(__name__)

#: The loader accepts only a shim reporting this version (see blas_shim.c).
SHIM_VERSION = 3

#: GFLOP/s above which a measured float32 GEMM counts as "fast". The
#: reference BLAS manages ~6 on a modern x86 core, OpenBLAS well over 100.
FAST_GFLOPS_THRESHOLD = 30.0

_GEMM_SYMBOLS = ("cblas_sgemm", "cblas_dgemm", "cblas_cgemm")
_THREAD_ENV = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


@dataclass(frozen=True)
class BlasInfo:
    """Which BLAS MLX's CPU GEMM calls will reach, as far as we can tell."""

    name: str
    path: str | None
    fast: bool
    note: str = ""


class BlasLoadError(RuntimeError):
    """A candidate BLAS could not be loaded; the caller tries the next one."""


_lock = threading.Lock()
_result: BlasInfo | None = None
# ctypes handles must stay referenced or the libraries could be unloaded.
_handles: list[ctypes.CDLL] = []


def load_fast_blas() -> BlasInfo:
    """Make MLX use a fast BLAS; idempotent, must run before ``import mlx.core``.

    If ``mlx.core`` is already imported its GEMM symbols are most likely bound
    already, so the load is still attempted but the result is checked by
    measurement and carries a note explaining the late call.
    """
    global _result
    with _lock:
        if _result is None:
            _result = _load()
            log.debug("BLAS selected: %s", _result)
        return _result


def _load() -> BlasInfo:
    if sys.platform == "darwin":
        return BlasInfo("accelerate/metal", None, True)
    if not sys.platform.startswith("linux"):
        return BlasInfo("platform default", None, False, "no fast-BLAS routing on this platform")
    late = "mlx.core" in sys.modules
    info = _load_linux()
    if not late or info.path is None:
        return info
    gflops = measure_gflops()
    return BlasInfo(
        info.name,
        info.path,
        gflops >= FAST_GFLOPS_THRESHOLD,
        "mlx.core was imported before load_fast_blas(); "
        f"measured {gflops:.0f} GFLOP/s after loading",
    )


def _load_linux() -> BlasInfo:
    _sane_thread_count()
    forced = os.environ.get("MLXCEL_BLAS", "").strip()
    if forced.lower() in ("reference", "none", "off"):
        return BlasInfo("reference", None, False, "MLXCEL_BLAS=reference")
    if forced:
        try:
            return _load_library(Path(forced).expanduser(), origin="MLXCEL_BLAS")
        except (BlasLoadError, OSError) as exc:
            log.warning(
                "MLXCEL_BLAS=%s could not be used (%s); using the reference BLAS", forced, exc
            )
            return BlasInfo("reference", None, False, f"MLXCEL_BLAS failed: {exc}")

    failures: list[str] = []
    scipy_lib = _scipy_openblas_path()
    if scipy_lib is not None:
        try:
            return _load_library(
                scipy_lib, origin=f"scipy-openblas32 {_dist_version('scipy-openblas32')}"
            )
        except (BlasLoadError, OSError) as exc:
            failures.append(f"scipy-openblas32: {exc}")
    for candidate in _system_openblas_candidates():
        try:
            return _load_library(Path(candidate), origin=f"system {Path(candidate).name}")
        except (BlasLoadError, OSError) as exc:
            failures.append(f"{candidate}: {exc}")
    note = "; ".join(failures) or "no OpenBLAS found"
    log.warning("No fast BLAS available, MLX CPU matmuls will be slow: %s", note)
    return BlasInfo("reference", None, False, note)


def _sane_thread_count() -> None:
    """Cap OpenBLAS threads at the CPUs this process may actually run on.

    OpenBLAS sizes its pool from the machine's core count, which in a pinned
    or containerised process can exceed the usable CPUs and makes GEMM
    threads fight each other. Explicit user settings always win, and the
    core-type / cache-size overrides are never touched.
    """
    if any(os.environ.get(name) for name in _THREAD_ENV):
        return
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return
    if usable > 0:
        os.environ["OPENBLAS_NUM_THREADS"] = str(usable)


def _load_library(path: Path, *, origin: str) -> BlasInfo:
    """Load ``path`` globally, adding the shim when its symbols are prefixed."""
    if not path.exists() and "/" in str(path):
        raise BlasLoadError(f"{path} does not exist")
    lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    _handles.append(lib)
    if all(hasattr(lib, sym) for sym in _GEMM_SYMBOLS):
        _check_global_binding(lib)
        return BlasInfo(f"openblas ({origin})", str(path), True)
    if not all(hasattr(lib, f"scipy_{sym}") for sym in _GEMM_SYMBOLS):
        raise BlasLoadError(f"{path} exports neither cblas_sgemm nor scipy_cblas_sgemm")
    shim_path = build_shim(path)
    shim = ctypes.CDLL(str(shim_path), mode=ctypes.RTLD_GLOBAL)
    _handles.append(shim)
    if shim_version(shim) != SHIM_VERSION:
        raise BlasLoadError(f"{shim_path} is not version {SHIM_VERSION} of the shim")
    _check_global_binding(shim)
    kernel = f"{shim_isa(shim)} kernel on {shim_threads(shim)} threads"
    return BlasInfo(f"openblas ({origin} via shim, {kernel})", str(path), True)


def shim_version(shim: ctypes.CDLL) -> int:
    """The shim's ``mlxcel_blas_shim_version()``, or -1 for another library."""
    if not hasattr(shim, "mlxcel_blas_shim_version"):
        return -1
    return int(shim.mlxcel_blas_shim_version())


def shim_isa(shim: ctypes.CDLL) -> str:
    """The instruction set the shim's skinny kernel was compiled for."""
    shim.mlxcel_blas_shim_isa.restype = ctypes.c_char_p
    return bytes(shim.mlxcel_blas_shim_isa()).decode()


def shim_threads(shim: ctypes.CDLL) -> int:
    """Threads the shim's skinny kernel runs on (starts its pool)."""
    return int(shim.mlxcel_blas_shim_threads())


def _check_global_binding(lib: ctypes.CDLL) -> None:
    """Fail unless a global lookup of the GEMM names lands in ``lib``.

    An earlier ``RTLD_GLOBAL`` library (say another BLAS pulled in by some
    other package) would shadow ours; then the reroute silently does nothing.
    """
    process = ctypes.CDLL(None)
    for sym in _GEMM_SYMBOLS:
        ours = ctypes.cast(getattr(lib, sym), ctypes.c_void_p).value
        try:
            seen = ctypes.cast(getattr(process, sym), ctypes.c_void_p).value
        except AttributeError as exc:
            raise BlasLoadError(f"{sym} is not visible globally after loading") from exc
        if ours != seen:
            raise BlasLoadError(f"{sym} is already provided globally by another library")


def _scipy_openblas_path() -> Path | None:
    try:
        # Imported by name: the package ships no type information.
        scipy_openblas32 = importlib.import_module("scipy_openblas32")
    except ImportError:
        return None
    lib_dir = Path(scipy_openblas32.get_lib_dir())
    candidate = lib_dir / scipy_openblas32.get_library(fullname=True)
    return candidate if candidate.exists() else None


def _system_openblas_candidates() -> list[str]:
    names = ["libopenblas.so.0"]
    found = ctypes.util.find_library("openblas")
    if found and found not in names:
        names.append(found)
    return names


def _dist_version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def build_shim(openblas: Path) -> Path:
    """The shim for ``openblas`` and this CPU, compiled into the cache once (see
    :mod:`mlxcel.model.native.build` for the instruction set and the cache naming)."""
    try:
        return build.build_shim(openblas)
    except build.NativeBuildError as exc:
        raise BlasLoadError(str(exc)) from exc


def measure_gflops(n: int = 512, seconds: float = 0.2) -> float:
    """Effective float32 GEMM GFLOP/s of MLX's default device, in ~``seconds``.

    Cheap enough for a start-up log line and tells at a glance whether the
    BLAS reroute took effect (reference ~6, OpenBLAS >100 on x86).
    """
    import mlx.core as mx

    a = mx.random.normal((n, n), dtype=mx.float32)
    b = mx.random.normal((n, n), dtype=mx.float32)
    mx.eval(a, b, a @ b)  # warm-up: allocations, thread pools
    runs = 0
    start = time.perf_counter()
    elapsed = 0.0
    while runs < 2 or elapsed < seconds:
        mx.eval(a @ b)
        runs += 1
        elapsed = time.perf_counter() - start
    return 2.0 * n**3 * runs / elapsed / 1e9


def describe(info: BlasInfo | None = None, gflops: float | None = None) -> str:
    """One log line: which BLAS, from where, and how fast it measured."""
    info = info if info is not None else load_fast_blas()
    parts = [f"BLAS: {info.name}"]
    if info.path:
        parts.append(f"from {info.path}")
    if gflops is None:
        gflops = measure_gflops()
    parts.append(f"{gflops:.0f} GFLOP/s float32 GEMM")
    threads = os.environ.get("OPENBLAS_NUM_THREADS")
    if threads and info.path:
        parts.append(f"{threads} threads")
    text = ", ".join(parts)
    if not info.fast:
        text += " (slow; see MLXCEL_BLAS)"
    if info.note:
        text += f" [{info.note}]"
    return text
