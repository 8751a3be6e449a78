"""The BLAS shim's sgemm against OpenBLAS's own, for every build this CPU can run.

Each build (AVX-512, AVX2+FMA, generic; those the CPU supports) is compiled
into the test's temporary folder and loaded with ctypes next to OpenBLAS, so
one call can go to both with the same arguments: every row count from 1 (the
sgemv route) through the skinny kernel to past its limit (OpenBLAS), both
orders, all four transpositions, leading dimensions past the minimum, weight
rows on a shared misaligned boundary (the kernel's aligned path) or not,
alpha != 1, and beta 0 (over a C full of NaN), 1 and 0.5.
"""

from __future__ import annotations

import ctypes
import importlib
import itertools
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mlxcel.model.native.blas import SHIM_VERSION
from mlxcel.model.native.build import build_shim, probe

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="BLAS rerouting is Linux-only"
)

ROW, COL, NO_T, T = 101, 102, 111, 112
_NARROW_TO_WIDE = ("generic", "avx2", "avx512")
ISAS = list(_NARROW_TO_WIDE[: _NARROW_TO_WIDE.index(probe().isa) + 1])
"""The builds this CPU can run: its widest and every narrower one."""
ROWS = [*range(1, 71), 600]


def openblas_path() -> Path:
    mod = importlib.import_module("scipy_openblas32")
    return Path(mod.get_lib_dir()) / mod.get_library(fullname=True)


def _sgemm(fn: Any) -> Any:
    i, f, p = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    fn.argtypes = [i, i, i, i, i, i, f, p, i, p, i, f, p, i]
    fn.restype = None
    return fn


@dataclass
class Libs:
    shim: Any  # the build's cblas_sgemm
    ref: Any  # OpenBLAS's scipy_cblas_sgemm
    path: Path  # the build


@pytest.fixture(scope="module", params=ISAS)
def libs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Libs:
    out = tmp_path_factory.mktemp("shim")
    path = build_shim(openblas_path(), request.param, out)
    lib = ctypes.CDLL(str(path))
    lib.mlxcel_blas_shim_isa.restype = ctypes.c_char_p
    assert lib.mlxcel_blas_shim_isa() == request.param.encode()
    assert lib.mlxcel_blas_shim_version() == SHIM_VERSION
    openblas = ctypes.CDLL(str(openblas_path()))
    # The reference runs on one thread. Its workers spin after each call, as the shim's
    # pool does: on two cores the two pools take turns waiting out each other's spin,
    # and a parameter's 1,704 calls took half a minute instead of a few seconds.
    openblas.scipy_openblas_set_num_threads(1)
    return Libs(_sgemm(lib.cblas_sgemm), _sgemm(openblas.scipy_cblas_sgemm), path)


@dataclass
class Case:
    """One sgemm call's arguments over flat buffers, and what bounds its error."""

    order: int
    ta: int
    tb: int
    m: int
    n: int
    k: int
    alpha: float
    beta: float
    a: np.ndarray[Any, Any]
    lda: int
    b: np.ndarray[Any, Any]
    ldb: int
    c: np.ndarray[Any, Any]
    ldc: int
    products: np.ndarray[Any, Any]  # |op(A)| @ |op(B)| in float64

    def call(self, fn: Any, c: np.ndarray[Any, Any]) -> None:
        fn(self.order, self.ta, self.tb, self.m, self.n, self.k, self.alpha,
           self.a.ctypes.data, self.lda, self.b.ctypes.data, self.ldb, self.beta,
           c.ctypes.data, self.ldc)  # fmt: skip

    def logical_c(self, c: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """C as an m x n matrix (a view into the flat buffer)."""
        return stored(c, self.order, self.m, self.n, self.ldc, NO_T)

    def bound(self) -> np.ndarray[Any, Any]:
        """Float32 rounding bound of each element: a few ulps per term."""
        scale = abs(self.alpha) * self.products + abs(self.beta) * np.abs(self.logical_c(self.c))
        return 4 * float(np.finfo(np.float32).eps) * (self.k + 2) * scale + 1e-30


def stored(
    flat: np.ndarray[Any, Any], order: int, rows: int, cols: int, ld: int, trans: int
) -> np.ndarray[Any, Any]:
    """op(X) (rows x cols) as a view of X's flat buffer, as BLAS reads it."""
    r, c = (rows, cols) if trans == NO_T else (cols, rows)  # X itself is r x c
    if order == COL:
        x = flat[: c * ld].reshape(c, ld)[:, :r].T
    else:
        x = flat[: r * ld].reshape(r, ld)[:, :c]
    return x if trans == NO_T else x.T


def make_case(
    rng: np.random.Generator, order: int, ta: int, tb: int, m: int, n: int, k: int,
    beta: float, aligned_rows: bool,
) -> Case:  # fmt: skip
    """Random operands with leading dimensions past the minimum: odd padding,
    or rows a multiple of 16 floats apart from a base off a 64-byte boundary."""

    def buffer(rows: int, cols: int, trans: int, pad: int) -> tuple[np.ndarray[Any, Any], int]:
        r, c = (rows, cols) if trans == NO_T else (cols, rows)
        lines, length = (r, c) if order == ROW else (c, r)  # the buffer's rows of `ld`
        ld = -(-length // 16) * 16 if aligned_rows else length + pad
        shift = int(rng.integers(1, 16)) if aligned_rows else 0
        flat = rng.standard_normal(lines * ld + 16).astype(np.float32)
        return flat[shift : shift + lines * ld], ld

    a, lda = buffer(m, k, ta, 3)
    b, ldb = buffer(k, n, tb, 5)
    c, ldc = buffer(m, n, NO_T, 2)
    op_a = np.abs(stored(a, order, m, k, lda, ta).astype(np.float64))
    op_b = np.abs(stored(b, order, k, n, ldb, tb).astype(np.float64))
    return Case(order, ta, tb, m, n, k, 1.5, beta, a, lda, b, ldb, c, ldc, op_a @ op_b)


def check(libs: Libs, case: Case) -> None:
    ours, ref = case.c.copy(), case.c.copy()
    if case.beta == 0.0:
        case.logical_c(ours)[...] = np.nan  # beta = 0 must not read C
    case.call(libs.shim, ours)
    case.call(libs.ref, ref)
    got, want = case.logical_c(ours), case.logical_c(ref)
    assert np.all(np.abs(got - want) <= case.bound()), (case.m, case.n, case.k)
    outside = np.ones(ours.shape, bool)
    case.logical_c(outside)[...] = False
    assert np.array_equal(ours[outside], case.c[outside])  # padding untouched


LAYOUTS = list(itertools.product((ROW, COL), (NO_T, T), (NO_T, T)))


@pytest.mark.parametrize("aligned_rows", [False, True], ids=["padded", "aligned-rows"])
@pytest.mark.parametrize(("n", "k"), [(37, 29), (133, 259), (5, 3)])
def test_sgemm_matches_openblas(libs: Libs, n: int, k: int, aligned_rows: bool) -> None:
    rng = np.random.default_rng(n * k)
    for m, (order, ta, tb) in itertools.product(ROWS, LAYOUTS):
        case = make_case(rng, order, ta, tb, m, n, k, 0.0, aligned_rows)
        for beta in (0.0, 1.0, 0.5):
            check(libs, replace(case, beta=beta))


def test_small_side_on_either_operand(libs: Libs) -> None:
    """Many rows times few columns is the same product turned over: the kernel
    takes it with B as the activations and C written down its columns."""
    rng = np.random.default_rng(7)
    for n, (order, ta, tb), beta in itertools.product((1, 2, 7, 48), LAYOUTS, (0.0, 0.5)):
        check(libs, make_case(rng, order, ta, tb, 777, n, 300, beta, aligned_rows=False))


def test_concurrent_callers(libs: Libs) -> None:
    """Threads calling at once (the pool serves one, the rest run alone) all get
    their own right answer."""
    rng = np.random.default_rng(3)
    cases = [make_case(rng, ROW, NO_T, T, 16, 2000, 1100, 0.0, False) for _ in range(6)]
    errors: list[BaseException] = []

    def run(case: Case) -> None:
        try:
            for _ in range(20):
                check(libs, case)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(case,)) for case in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


MLX_PROBE = """
import json, sys
import numpy as np
from mlxcel.model.native.blas import load_fast_blas
info = load_fast_blas()
import mlx.core as mx
mx.set_default_device(mx.cpu)
rng = np.random.default_rng(0)
worst = 0.0
for m in (1, 3, 16, 40, 64, 100):
    for n, k in ((896, 896), (130, 77)):
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((n, k)).astype(np.float32)
        want, scale = x.astype(np.float64) @ w.T, np.abs(x).astype(np.float64) @ np.abs(w).T
        for got, expected, size in (
            (mx.array(x) @ mx.array(w).T, want, scale),
            (mx.array(x) @ mx.array(w.T.copy()), want, scale),
            (mx.array(w) @ mx.array(x).T, want.T, scale.T),
        ):
            bound = 4 * 2.0**-23 * (k + 2) * size + 1e-30
            worst = max(worst, float(np.max(np.abs(np.array(got) - expected) / bound)))
print(json.dumps({"name": info.name, "worst": worst}))
"""


@pytest.mark.parametrize("isa", ISAS)
def test_mlx_matmul_through_the_shim(isa: str, tmp_path: Path) -> None:
    env = {**os.environ, "MLXCEL_CACHE_DIR": str(tmp_path), "MLXCEL_CPU_ISA": isa}
    result = subprocess.run(
        [sys.executable, "-c", MLX_PROBE], env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert f"via shim, {isa} kernel" in data["name"], data
    assert data["worst"] <= 1.0, data  # within float32 rounding of float64
    assert [p.name.split("-")[3] for p in (tmp_path / "native").glob("*.so")] == [isa]


FORK_PROBE = """
import ctypes, os, signal, sys
import numpy as np
lib = ctypes.CDLL(sys.argv[1])
i, f, p = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
lib.cblas_sgemm.argtypes = [i, i, i, i, i, i, f, p, i, p, i, f, p, i]
x = np.ones((16, 512), np.float32)
w = np.ones((1024, 512), np.float32)

def product():
    c = np.zeros((16, 1024), np.float32)
    lib.cblas_sgemm(101, 111, 112, 16, 1024, 512, 1.0, x.ctypes.data, 512,
                    w.ctypes.data, 512, 0.0, c.ctypes.data, 1024)
    return bool(np.all(c == 512.0))

def threads():
    return len(os.listdir("/proc/self/task"))

assert product()
print(threads())  # the caller and the pool's worker
pid = os.fork()
if pid == 0:  # only the forking thread survives; the first product starts a new worker
    signal.alarm(20)
    os._exit(10 * product() + threads())
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""


def test_forked_child_gets_its_own_pool(libs: Libs) -> None:
    result = subprocess.run(
        [sys.executable, "-c", FORK_PROBE, str(libs.path)], capture_output=True, text=True,
        timeout=120, check=False,
        env={**os.environ, "MLXCEL_BLAS_THREADS": "2", "OPENBLAS_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["2", "12"]  # right answer, two threads again
