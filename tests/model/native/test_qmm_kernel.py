"""The C quantized matmul kernel (model/native/qmm_kernel.c) against MLX's dequantize + matmul.

Every build this CPU can run (AVX-512 with and without its AMX path, AVX2, portable C) is
compiled through the native build (``build_qmm_library``) and called through ctypes
(``qmm_lib``). Each result must equal
x . dequantize(w)^T, computed in float64 from `mx.dequantize`, within float32 rounding:
1e-5 of the product of the row norms. Compile-time knobs steer calls onto each path
(direct, panel, BLAS, AMX); test builds report which one a call took.
"""

from __future__ import annotations

import ctypes
import mmap
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from mlxcel.model.native.blas import load_fast_blas
from mlxcel.model.native.build import build_qmm_library, probe
from mlxcel.model.native.qmm_lib import Kernel

pytestmark = pytest.mark.mlx

load_fast_blas()  # before mlx.core is imported below: the BLAS path needs cblas_sgemm bound

import mlx.core as mx  # noqa: E402

ISAS = [isa for isa in ("avx512", "avx2", "generic") if probe().runs(isa)]
NO_AMX = {"QMM_NO_AMX": 1}
NO_VBMI = {"QMM_NO_VBMI": 1}
#: (build, compile-time knobs): every build the CPU runs; AVX-512 also without AMX, and
#: without VBMI (the pdep unpacking older AVX-512 CPUs get; no AMX path either).
BUILDS = [(isa, {}) for isa in ISAS] + (
    [("avx512", NO_AMX), ("avx512", NO_VBMI)] if "avx512" in ISAS else []
)
BUILD_IDS = [isa + "".join(f"-{k[4:].lower()}" for k in d) for isa, d in BUILDS]
BITS = (2, 3, 4, 5, 6, 8)
GROUPS = (32, 64, 128)
MS = (1, 2, 3, 7, 16, 33, 64, 600)
NS = (1, 3, 67, 1000)
NO_BLAS = {"QMM_BLAS_MIN_M": 1 << 30}
ALL_BLAS = {"QMM_BLAS_MIN_M": 1}

KernelFactory = Callable[[str, dict[str, int] | None], Kernel]


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> KernelFactory:
    """Builds (and caches) the kernel for an ISA and a set of compile-time knobs."""
    out = tmp_path_factory.mktemp("qmm")
    cache: dict[tuple[str, str], Kernel] = {}

    def get(isa: str, defines: dict[str, int] | None = None) -> Kernel:
        key = (isa, repr(sorted((defines or {}).items())))
        if key not in cache:
            cache[key] = Kernel.load(build_qmm_library(isa, out, defines))
        return cache[key]

    return get


def guarded(a: np.ndarray) -> np.ndarray:
    """A copy of `a` whose last byte is followed by an unreadable page, so a kernel that
    reads past the end of the weights crashes instead of passing."""
    page = mmap.PAGESIZE
    size = (a.nbytes + page - 1) // page * page
    region = mmap.mmap(-1, size + page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    libc = ctypes.CDLL(None)
    assert libc.mprotect(ctypes.c_void_p(base + size), page, 0) == 0  # PROT_NONE
    out = np.frombuffer(region, dtype=a.dtype, count=a.size, offset=size - a.nbytes)
    out = out.reshape(a.shape)
    out[...] = a
    return out  # holds the mapping open as long as it lives


def make_case(
    n: int, k: int, bits: int, group: int, m: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x, MLX-quantized (w, scales, biases) and their float64 dequantized weights."""
    rng = np.random.default_rng(seed + 97 * bits + group + k)
    w = mx.array(rng.standard_normal((n, k), dtype=np.float32))
    q, s, b = mx.quantize(w, group_size=group, bits=bits)
    dq = np.array(mx.dequantize(q, s, b, group_size=group, bits=bits), dtype=np.float64)
    x = rng.standard_normal((m, k), dtype=np.float32)
    return x, np.array(q), np.array(s), np.array(b), dq


def assert_close(y: np.ndarray, x: np.ndarray, dq: np.ndarray) -> None:
    """Within float32 rounding of x . dq^T: 1e-5 of |x_m| |w_n| per element."""
    ref = x.astype(np.float64) @ dq.T
    scale = np.linalg.norm(x.astype(np.float64), axis=1)[:, None] * np.linalg.norm(dq, axis=1)
    err = np.abs(y - ref) / np.maximum(scale, 1e-30)
    assert err.max() <= 1e-5, f"worst relative error {err.max():.2e} at {np.argmax(err)}"


def run_slices(kern: Kernel, bits: int, group: int, k: int, ms: tuple[int, ...],
               ns: tuple[int, ...]) -> None:  # fmt: skip
    """Every (M, N) from slices of one case; weights end at an unreadable page."""
    x, q, s, b, dq = make_case(max(ns), k, bits, group, max(ms))
    for n in ns:
        qn, sn, bn = guarded(q[:n]), np.ascontiguousarray(s[:n]), np.ascontiguousarray(b[:n])
        for m in ms:
            xm = np.ascontiguousarray(x[:m])
            y = kern.qmm(xm, qn, sn, bn, bits, group)
            assert_close(y, xm, dq[:n])


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize(("isa", "defines"), BUILDS, ids=BUILD_IDS)
def test_every_shape_matches_dequantize_matmul(
    kernel: KernelFactory, isa: str, defines: dict[str, int], bits: int, group: int
) -> None:
    """All M and odd N, K of one group, of a few groups, and past one K block (1024)."""
    kern = kernel(isa, defines)
    assert kern.isa == isa.split("-")[0]
    for k in (group, 384, 1024 + group):
        run_slices(kern, bits, group, k, MS if k == 384 else (1, 7, 600), NS)


@pytest.mark.parametrize("isa", ISAS)
def test_panel_path_serves_prompt_sized_m_without_blas(kernel: KernelFactory, isa: str) -> None:
    """With the BLAS and AMX paths compiled out, M = 600 runs on the register kernels."""
    for bits in (4, 5, 8):
        run_slices(kernel(isa, NO_BLAS | NO_AMX), bits, 64, 1024 + 64, (64, 600), (67,))


def expected_path(isa: str, defines: dict[str, int], m: int) -> str:
    """Where a call of M rows should go: AMX from 5 rows on when the CPU has it, else
    the register kernels (direct for few rows) up to the BLAS threshold."""
    if isa == "avx512" and "QMM_NO_AMX" not in defines and probe().amx and m >= 5:
        return "amx"
    if m >= defines.get("QMM_BLAS_MIN_M", 96):
        return "blas"
    return "direct" if m <= {"avx512": 4, "avx2": 2}.get(isa, 4) else "panel"


@pytest.mark.parametrize(
    "defines", [{}, NO_AMX, NO_AMX | NO_BLAS, NO_AMX | ALL_BLAS], ids=["default", "noamx",
                "noamx-noblas", "noamx-allblas"]
)  # fmt: skip
@pytest.mark.parametrize("isa", ISAS)
def test_each_path_is_taken_where_intended(
    kernel: KernelFactory, isa: str, defines: dict[str, int]
) -> None:
    assert hasattr(ctypes.CDLL(None), "cblas_sgemm"), "no cblas_sgemm bound: blas untestable"
    kern = kernel(isa, defines | {"QMM_TESTING": 1})
    x, q, s, b, dq = make_case(40, 256, 5, 32, 600)
    for m in (1, 2, 3, 4, 5, 7, 16, 95, 96, 600):
        xm = np.ascontiguousarray(x[:m])
        assert_close(kern.qmm(xm, q, s, b, 5, 32), xm, dq)
        assert kern.last_path() == expected_path(isa, defines, m), m


def test_amx_can_be_switched_off_by_environment(
    kernel: KernelFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLXCEL_QMM_AMX=0, read at the first call that could use the tiles."""
    monkeypatch.setenv("MLXCEL_QMM_AMX", "0")
    kern = kernel(ISAS[0], {"QMM_TESTING": 2})  # a library of its own: fresh state
    x, q, s, b, dq = make_case(40, 256, 5, 32, 16)
    assert_close(kern.qmm(x, q, s, b, 5, 32), x, dq)
    assert kern.last_path() == "panel"
    monkeypatch.delenv("MLXCEL_QMM_AMX")
    assert_close(kern.qmm(x, q, s, b, 5, 32), x, dq)
    assert kern.last_path() == "panel"  # settled once per process


@pytest.mark.parametrize("isa", ISAS)
def test_blas_path_matches_for_every_m(kernel: KernelFactory, isa: str) -> None:
    """With the BLAS path taken from M = 1 up: dequantized tiles through cblas_sgemm."""
    assert hasattr(ctypes.CDLL(None), "cblas_sgemm"), "no cblas_sgemm bound: path untested"
    for bits in (3, 5, 8):
        run_slices(kernel(isa, ALL_BLAS), bits, 32, 384, (1, 7, 600), (1, 67, 1000))
    # Tiles of rows: N well past one tile (2^18 / K rows).
    run_slices(kernel(isa, ALL_BLAS), 4, 128, 128, (33,), (2100,))


def test_agrees_with_mlx_quantized_matmul(kernel: KernelFactory) -> None:
    """The contract: what mx.quantized_matmul(..., transpose=True) computes."""
    kern = kernel(ISAS[0], None)
    for bits, group, m in ((4, 64, 1), (5, 32, 16), (8, 128, 600), (6, 32, 3)):
        x, q, s, b, dq = make_case(67, 256, bits, group, m)
        ours = kern.qmm(x, q, s, b, bits, group)
        theirs = np.array(
            mx.quantized_matmul(mx.array(x), mx.array(q), mx.array(s), mx.array(b),
                                transpose=True, group_size=group, bits=bits)
        )  # fmt: skip
        assert_close(theirs, x, dq)  # the reference is MLX's own result, to rounding
        assert_close(ours, x, dq)


@pytest.mark.parametrize("isa", ISAS)
def test_thread_count_does_not_change_a_single_bit(kernel: KernelFactory, isa: str) -> None:
    """Threads split N only: every output element is computed the same way."""
    kern = kernel(isa, None)
    x, q, s, b, _ = make_case(999, 512, 5, 32, 5)
    results = []
    for threads in (1, 2, 3, 8, 0):
        kern.set_threads(threads)
        results.append(kern.qmm(x, q, s, b, 5, 32))
    kern.set_threads(0)
    for y in results[1:]:
        np.testing.assert_array_equal(y, results[0])


def test_workers_asleep_or_spinning_answer_every_call(kernel: KernelFactory) -> None:
    """Back to back calls (workers spinning), calls after a pause (workers asleep), and
    more calls than the pool's 16-bit generation counter holds."""
    kern = kernel(ISAS[0], None)
    kern.set_threads(2)
    x, q, s, b, dq = make_case(256, 512, 4, 64, 1)
    y = np.empty((1, 256), np.float32)
    call = kern.prepare(x, q, s, b, 4, 64, y)
    for pause in (0.0, 0.01, 0.0, 0.05):
        time.sleep(pause)
        y[...] = np.nan
        assert call() == 0
        assert_close(y, x, dq)
    for _ in range(70_000):
        call()
    y[...] = np.nan
    assert call() == 0
    assert_close(y, x, dq)
    kern.set_threads(0)


@pytest.mark.parametrize(
    ("bits", "group", "k"),
    [(7, 32, 64), (1, 32, 64), (9, 32, 64), (4, 16, 64), (4, 256, 256), (4, 48, 96),
     (4, 32, 48), (4, 64, 32)],
)  # fmt: skip
def test_unsupported_combinations_are_refused_untouched(
    kernel: KernelFactory, bits: int, group: int, k: int
) -> None:
    kern = kernel(ISAS[0], None)
    x = np.ones((2, k), np.float32)
    words = max(1, k * max(bits, 1) // 32)
    w = np.zeros((3, words), np.uint32)
    sb = np.ones((3, max(1, k // group)), np.float32)
    y = np.full((2, 3), 7.0, np.float32)
    assert kern.qmm_into(x, w, sb, sb, bits, group, y) != 0
    assert (y == 7.0).all()


def test_isa_names_the_build(kernel: KernelFactory) -> None:
    assert [kernel(isa, None).isa for isa in ISAS] == ISAS
    assert Path(kernel("generic", None).lib._name).exists()
