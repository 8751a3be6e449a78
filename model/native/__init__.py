"""The CPU acceleration: native code built for this machine and loaded once per process.

- ``blas``: the fast BLAS (OpenBLAS through a C shim, ``blas_shim.c`` with its skinny
  kernel ``blas_skinny.c``), loaded before MLX;
- ``kernels``: the CPU kernels as one extension of MLX primitives (the quantized matmul
  ``qmm_kernel.c``/``qmm_ext.cpp``, attention and SwiGLU ``attn_kernel.c``/``attn_ext.cpp``,
  a layer's head and tail ``layer_kernel.c``/``layer_ext.cpp``), given to models by ``qmm.py``
  and ``cpu_forms.py``, and to the flattened forward by ``fused_layer.py``;
- ``build``: the one CPU probe and build of both; ``pool.c`` their one thread pool and
  ``simd.h`` their vector operations; ``qmm_lib.py`` the kernel alone for its tests.

:func:`accelerate` is the front door: the BLAS, then the kernels, and a record of what
runs, logged in one line. Importing this package imports no MLX (``blas.load_fast_blas()``
must run before ``mlx.core`` is first imported; ``accelerate`` does that first).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlxcel.model.native.blas import BlasInfo, describe, load_fast_blas, measure_gflops
from mlxcel.model.native.build import Cpu, probe

if TYPE_CHECKING:
    from mlxcel.model.native.kernels import KernelsStatus

__all__ = ["Acceleration", "accelerate", "load_fast_blas"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Acceleration:
    """What runs MLX's CPU work in this process: the CPU as probed, the BLAS MLX's matrix
    products reach (and its measured float32 GEMM rate), the CPU kernels or why not."""

    cpu: Cpu
    blas: BlasInfo
    gflops: float
    kernels: KernelsStatus | None
    """None where MLX does not run on the CPU (an Apple GPU keeps MLX's own kernels)."""

    @property
    def fell_back(self) -> bool:
        """Whether something runs slower than it could: the reference BLAS, or MLX's own
        operations where the kernels were wanted (``MLXCEL_CPU_ISA=off`` is asked for)."""
        kernels = self.kernels
        lost = kernels is not None and not kernels.available and not kernels.turned_off
        return not self.blas.fast or lost

    def line(self) -> str:
        """The log line: the CPU, the BLAS and its measured rate, the kernels."""
        kernels = "not used (MLX runs on its GPU)"
        if self.kernels is not None:
            kernels = self.kernels.describe()
        blas = describe(self.blas, self.gflops)
        return f"CPU: {self.cpu.describe()}; {blas}; CPU kernels: {kernels}"


_lock = threading.Lock()
_done: Acceleration | None = None


def accelerate() -> Acceleration:
    """The fast BLAS (first: before ``mlx.core`` when it is not imported yet), then the CPU
    kernels (built once per machine, loaded and self-checked once per process); the
    record, logged in one line the first time (a warning when something fell back).

    Idempotent and thread-safe; never raises: what cannot be had is said in the record and
    the line, and MLX's own code runs instead, only slower.
    """
    global _done
    with _lock:
        if _done is None:
            _done = _accelerate()
            (log.warning if _done.fell_back else log.info)("%s", _done.line())
        return _done


def _accelerate() -> Acceleration:
    blas = load_fast_blas()
    import mlx.core as mx

    kernels = None
    if mx.default_device().type == mx.DeviceType.cpu:
        from mlxcel.model.native.kernels import load_kernels

        kernels = load_kernels()
    return Acceleration(probe(), blas, measure_gflops(), kernels)
