"""The quantized matmul kernel (``qmm_kernel.c``) as a plain library called through ctypes.

For the kernel's own tests and ``bench/qmm.py``: no MLX in the loop, so a test can reach
each of its paths with the compile-time knobs (``build.build_qmm_library`` builds it,
through the same code path as the extension) and time the kernel alone. The extension
(``kernels.py``) is what serving uses.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
U32 = npt.NDArray[np.uint32]
_FLOATS = ctypes.POINTER(ctypes.c_float)


@dataclass
class Kernel:
    """A loaded build of the kernel library."""

    lib: ctypes.CDLL

    @classmethod
    def load(cls, path: Path) -> Kernel:
        lib = ctypes.CDLL(str(path))
        lib.mlxcel_qmm.restype = ctypes.c_int
        lib.mlxcel_qmm.argtypes = [
            _FLOATS, ctypes.c_long, ctypes.c_long, ctypes.POINTER(ctypes.c_uint32), _FLOATS,
            _FLOATS, ctypes.c_long, ctypes.c_int, ctypes.c_int, _FLOATS,
        ]  # fmt: skip
        lib.mlxcel_qmm_isa.restype = ctypes.c_char_p
        lib.mlxcel_pool_set_threads.argtypes = [ctypes.c_int]
        return cls(lib)

    def last_path(self) -> str:
        """The path of the last call; only builds with -DQMM_TESTING export it."""
        code = int(self.lib.mlxcel_qmm_last_path())
        return {1: "direct", 2: "panel", 3: "blas", 4: "amx"}[code]

    @property
    def isa(self) -> str:
        return bytes(self.lib.mlxcel_qmm_isa()).decode()

    def set_threads(self, n: int) -> None:
        """Restart the process's pool with ``n`` threads (0: the default again)."""
        self.lib.mlxcel_pool_set_threads(n)

    @property
    def threads(self) -> int:
        """Threads the kernel splits a call over (the pool's, the caller included)."""
        return int(self.lib.mlxcel_pool_threads())

    @property
    def pool_shared(self) -> bool:
        """Whether this library runs on the BLAS shim's pool (the process loaded the shim)."""
        return bool(self.lib.mlxcel_pool_shared())

    def qmm_into(
        self,
        x: F32,
        w: U32,
        scales: F32,
        biases: F32,
        bits: int,
        group: int,
        y: F32,
    ) -> int:
        """y = x . dequant(w)^T; returns the kernel's status. Arrays must be C-contiguous."""
        m, k = x.shape
        n = w.shape[0]
        for a in (x, w, scales, biases, y):
            assert a.flags.c_contiguous
        return int(
            self.lib.mlxcel_qmm(
                x.ctypes.data_as(_FLOATS), m, k,
                w.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32)),
                scales.ctypes.data_as(_FLOATS), biases.ctypes.data_as(_FLOATS),
                n, bits, group, y.ctypes.data_as(_FLOATS),
            )
        )  # fmt: skip

    def prepare(
        self,
        x: F32,
        w: U32,
        scales: F32,
        biases: F32,
        bits: int,
        group: int,
        y: F32,
    ) -> Callable[[], int]:
        """A call with its arguments converted once, for timing the kernel, not ctypes."""
        for a in (x, w, scales, biases, y):
            assert a.flags.c_contiguous
        fn = self.lib.mlxcel_qmm
        args = (
            x.ctypes.data_as(_FLOATS), x.shape[0], x.shape[1],
            w.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32)), scales.ctypes.data_as(_FLOATS),
            biases.ctypes.data_as(_FLOATS), w.shape[0], bits, group, y.ctypes.data_as(_FLOATS),
        )  # fmt: skip
        return lambda: int(fn(*args))

    def qmm(
        self,
        x: F32,
        w: U32,
        scales: F32,
        biases: F32,
        bits: int,
        group: int,
    ) -> F32:
        y = np.full((x.shape[0], w.shape[0]), np.nan, dtype=np.float32)
        status = self.qmm_into(x, w, scales, biases, bits, group, y)
        if status != 0:
            raise ValueError(f"mlxcel_qmm returned {status}")
        return y
