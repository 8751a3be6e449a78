"""mlxcel's CPU kernels, loaded once per process: quantized matmul, attention and SwiGLU.

MLX's CPU backend (the PyPI build on x86) is scalar code: its quantized matmul
re-dequantizes the weights for every row, and every element-wise op runs on one thread,
``exp`` at ~13 ns an element. The kernels (``qmm_kernel.c``, ``attn_kernel.c``) are
vectorised (AVX-512 or AVX2) and use every core; built by ``build.py`` into one
extension of MLX primitives, they stay nodes of MLX's lazy graph, so a forward is still
one evaluation.

:func:`load_kernels` builds (once per machine), imports and checks the extension; the
users (``qmm.py`` for quantized models, ``cpu_forms.py`` for attention and SwiGLU) go to
MLX's own operations when it says the kernels are unavailable. It logs nothing itself:
``accelerate()`` (the package's front door) reports it in its one line.
"""

from __future__ import annotations

import importlib.util
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import mlx.core as mx

from mlxcel.model.native.build import (
    KERNELS_MODULE,
    NativeBuildError,
    build_kernels,
    forced_isa,
    kernels_isa,
)


@dataclass(frozen=True)
class KernelsStatus:
    """Whether the kernels are available, and why not when they are not."""

    module: ModuleType | None
    isa: str | None
    note: str

    @property
    def available(self) -> bool:
        return self.module is not None

    @property
    def turned_off(self) -> bool:
        """Unavailable because ``MLXCEL_CPU_ISA=off`` asked for MLX's own operations."""
        return self.module is None and self.note == OFF

    def describe(self) -> str:
        """For the log: which kernels run, and on which pool; or why MLX's own do."""
        if self.module is None:
            return f"MLX's own operations ({self.note})"
        pool = "the BLAS shim's pool" if self.module.pool_shared() else "their own pool"
        return f"mlxcel's own ({self.isa}, on {pool} of {self.module.pool_threads()} threads)"


OFF = "MLXCEL_CPU_ISA=off"
"""The note of kernels turned off."""
_lock = threading.Lock()
_status: KernelsStatus | None = None


def load_kernels() -> KernelsStatus:
    """Build (once per machine) and import the extension; never raises.

    When it cannot be had (a CPU with neither AVX-512 nor AVX2, no compiler, a failed
    build or self-check, ``MLXCEL_CPU_ISA=off``), the status says why and models keep
    MLX's own operations.
    """
    global _status
    with _lock:
        if _status is None:
            _status = _load()
        return _status


def current_module() -> ModuleType | None:
    """The loaded extension, or None when it is not loaded (yet) or unavailable.

    For the hot paths: never builds or loads, so a call costs one attribute read.
    """
    status = _status
    return status.module if status is not None else None


def _load() -> KernelsStatus:
    isa = kernels_isa()
    if isa is None:
        why = OFF if forced_isa() == "off" else "no AVX-512 or AVX2 on this CPU"
        return KernelsStatus(None, None, why)
    try:
        module = import_extension(build_kernels(isa))
        self_check(module)
    except (NativeBuildError, ImportError, OSError, TypeError, ValueError) as exc:
        return KernelsStatus(None, None, f"the {isa} kernels could not be built or loaded: {exc}")
    return KernelsStatus(module, isa, f"{isa} kernels")


def import_extension(path: Path) -> ModuleType:
    """Import the built extension from ``path`` (a file outside any package)."""
    spec = importlib.util.spec_from_file_location(KERNELS_MODULE, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _close(ours: mx.array, theirs: mx.array) -> bool:
    return bool(mx.allclose(ours, theirs, rtol=1e-4, atol=1e-4).item())


def self_check(module: ModuleType) -> None:
    """One small call of each kernel against MLX's own, so a kernel that cannot be used is
    never used.

    An extension built against another nanobind ABI than MLX's raises TypeError here
    (it cannot take MLX's arrays); a miscompiled kernel gives other numbers.
    """
    weights = mx.random.normal((37, 64), key=mx.random.key(0))
    x = mx.random.normal((3, 64), key=mx.random.key(1))
    w, scales, biases = mx.quantize(weights, group_size=32, bits=4)
    ours = module.quantized_matmul(x, w, scales, biases, 32, 4)
    theirs = mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size=32, bits=4)
    if not _close(ours, theirs):
        raise ValueError("the quantized matmul's self-check differs from MLX's")
    q = mx.random.normal((1, 4, 5, 64), key=mx.random.key(2))
    k, v = (mx.random.normal((1, 2, 70, 64), key=mx.random.key(s)) for s in (3, 4))
    ours = module.attention(q, k, v, 0.125, causal=True)
    theirs = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal")
    if not _close(ours, theirs):
        raise ValueError("the attention's self-check differs from MLX's")
    gate = mx.random.normal((2, 50), key=mx.random.key(5)) * 8
    up = mx.random.normal((2, 50), key=mx.random.key(6))
    theirs = gate * mx.sigmoid(gate) * up
    if not _close(module.swiglu(gate, up), theirs):
        raise ValueError("the SwiGLU's self-check differs from MLX's")
