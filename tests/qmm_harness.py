"""Build ``model/qmm_kernel.c`` for one instruction set and call it through ctypes.

Shared by the kernel's tests and ``bench/qmm.py``. The kernel is plain C with
no Python binding of its own (the MLX extension links it), so this harness
compiles it with the system compiler into a caller-chosen directory and wraps
the three exported functions.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

SOURCE = Path(__file__).resolve().parents[1] / "model" / "native" / "qmm_kernel.c"

#: Compiler flags per build; the kernel picks its code path from them.
ISA_FLAGS: dict[str, tuple[str, ...]] = {
    "avx512": (
        "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vbmi", "-mbmi2", "-mfma",
    ),
    "avx512-pdep": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mbmi2", "-mfma"),
    "avx2": ("-mavx2", "-mfma", "-mbmi2", "-mf16c"),
    "generic": (),
}  # fmt: skip

#: CPU feature flags (as /proc/cpuinfo spells them) each build needs.
ISA_CPU_FLAGS: dict[str, tuple[str, ...]] = {
    "avx512": ("avx512f", "avx512bw", "avx512vl", "avx512vbmi", "bmi2", "fma"),
    "avx512-pdep": ("avx512f", "avx512bw", "avx512vl", "bmi2", "fma"),
    "avx2": ("avx2", "fma", "bmi2", "f16c"),
    "generic": (),
}

F32 = npt.NDArray[np.float32]
_FLOATS = ctypes.POINTER(ctypes.c_float)


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux), empty when they cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_supports(isa: str) -> bool:
    """Whether this CPU can run the build ``isa``."""
    return set(ISA_CPU_FLAGS[isa]) <= cpu_flags()


def cpu_has_amx() -> bool:
    """Whether the CPU has the tile unit the AVX-512 build uses when it can."""
    return {"amx_tile", "amx_bf16", "avx512vbmi"} <= cpu_flags()


def build(isa: str, out_dir: Path, defines: dict[str, int] | None = None) -> Path:
    """Compile the kernel for ``isa`` (plus ``-D`` knobs) into ``out_dir``."""
    compiler = os.environ.get("CC") or shutil.which("cc") or "gcc"
    tag = isa + "".join(f"-{k}{v}" for k, v in sorted((defines or {}).items()))
    target = out_dir / f"qmm-{tag}.so"
    cmd = [compiler, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared"]
    cmd += [*ISA_FLAGS[isa], *(f"-D{k}={v}" for k, v in (defines or {}).items())]
    cmd += ["-o", str(target), str(SOURCE), str(SOURCE.with_name("pool.c")), "-lpthread"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return target


@dataclass
class Kernel:
    """A loaded kernel build."""

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
        self.lib.mlxcel_pool_set_threads(n)

    def qmm_into(
        self,
        x: F32,
        w: npt.NDArray[np.uint32],
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
        w: npt.NDArray[np.uint32],
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
        w: npt.NDArray[np.uint32],
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
