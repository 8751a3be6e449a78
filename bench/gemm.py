"""Skinny float32 GEMMs: MLX through the BLAS shim against OpenBLAS's own sgemm.

Decoding multiplies a few activation rows (M = batch size) by every weight
matrix. For the default model's shapes (Qwen2.5-0.5B in float32) this prints
the time per call at M = 1, 4, 16, 64 of ``x @ W.T`` through MLX (loaded with
the shim, so its sgemm lands in the shim's kernel, sgemv or OpenBLAS) and of
OpenBLAS's ``scipy_cblas_sgemm`` called directly on the same arrays. Then a
whole forward's weight GEMMs (24 layers of distinct weights plus the head,
1.98 GB, more than any cache) at each M, as a multiple of streaming the same
bytes with every CPU (a tiny C loop built here, run on as many threads as
the kernel uses). Per-call times of one matrix are cache-warm; the forward
is what decoding sees. Prints medians; asserts nothing.

    .venv/bin/python bench/gemm.py [--rows 1,4,16,64] [--forward-rows 1,16] [--repeats 7]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlxcel.model.native.blas import BlasInfo, describe, load_fast_blas
from mlxcel.model.native.build import compilers

LAYERS = 24
HEAD = ("head", 151936, 896)
SHAPES = [  # (name, N, K): C[M, N] = x[M, K] @ W[N, K].T
    ("q", 896, 896), ("k, v", 128, 896), ("o", 896, 896),
    ("gate, up", 4864, 896), ("down", 896, 4864),
]  # fmt: skip
PER_LAYER = [SHAPES[0], SHAPES[1], SHAPES[1], SHAPES[2], SHAPES[3], SHAPES[3], SHAPES[4]]

STREAM_C = r"""
#include <pthread.h>
#include <stdint.h>
typedef struct { const uint64_t *a; long n; uint64_t out; } part;
static void *run(void *arg) {
  part *p = arg; uint64_t x[8] = {0};
  for (long i = 0; i + 8 <= p->n; i += 8)
    for (int j = 0; j < 8; j++) x[j] ^= p->a[i + j];
  for (int j = 0; j < 8; j++) p->out ^= x[j];
  return 0;
}
/* XOR of n words on `threads` threads: reads every byte once, no arithmetic to wait on. */
uint64_t stream(const uint64_t *a, long n, int threads) {
  pthread_t t[64]; part p[64]; uint64_t out = 0;
  for (int i = 0; i < threads; i++) {
    p[i] = (part){a + n / threads * i, n / threads, 0};
    pthread_create(&t[i], 0, run, &p[i]);
  }
  for (int i = 0; i < threads; i++) { pthread_join(t[i], 0); out ^= p[i].out; }
  return out;
}
"""


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after one warm-up.

    Waits first for OpenBLAS's workers to stop spinning (they spin for about
    0.1 s after each call), so that the previous measurement's threads do
    not compete with this one's.
    """
    time.sleep(0.3)
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def stream_rate(threads: int, gib: int = 2, repeats: int = 7) -> float:
    """Bytes per second at which ``threads`` threads read ``gib`` GiB once."""
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        lib_path = Path(tmp) / "stream.so"
        src = Path(tmp) / "stream.c"
        src.write_text(STREAM_C)
        cmd = [compilers().cc, "-O3", "-march=native", "-pthread", "-shared", "-fPIC"]
        subprocess.run([*cmd, "-o", str(lib_path), str(src)], check=True)
        lib = ctypes.CDLL(str(lib_path))
    lib.stream.restype = ctypes.c_uint64
    lib.stream.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_int]
    words = np.ones(gib << 27, dtype=np.uint64)
    seconds = median_time(lambda: lib.stream(words.ctypes.data, words.size, threads), repeats)
    return words.nbytes / seconds


class OpenBlas:
    """``scipy_cblas_sgemm`` called directly, ``x @ W.T`` on NumPy views."""

    def __init__(self, info: BlasInfo) -> None:
        if info.path is None:
            raise SystemExit(f"no OpenBLAS loaded ({info.name}); nothing to compare")
        lib = ctypes.CDLL(info.path)
        self.sgemm = lib.scipy_cblas_sgemm
        i, f, p = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
        self.sgemm.argtypes = [i, i, i, i, i, i, f, p, i, p, i, f, p, i]
        self.sgemm.restype = None

    def matmul_t(self, x: Any, w: Any, out: Any) -> None:
        m, k = x.shape
        n = w.shape[0]
        self.sgemm(101, 111, 112, m, n, k, 1.0, x.ctypes.data, k, w.ctypes.data, k, 0.0,
                   out.ctypes.data, n)  # fmt: skip


def per_call(blas: OpenBlas, rows: list[int], seconds: float) -> None:
    """Per shape and M: median time per call through MLX and direct."""
    import mlx.core as mx
    import numpy as np

    print(f"\nper call, median µs (one matrix, cache-warm); M = {rows}")
    print(f"{'shape':>9} {'N x K':>12} {'M':>3} {'MLX+shim':>9} {'OpenBLAS':>9} {'ratio':>6}")
    for name, n, k in [*SHAPES, HEAD]:
        w = mx.random.normal((n, k))
        mx.eval(w)
        w_np = np.asarray(memoryview(w))
        for m in rows:
            x = mx.random.normal((m, k))
            mx.eval(x)
            x_np = np.asarray(memoryview(x))
            out = np.empty((m, n), np.float32)
            estimate = 2e-10 * n * k * max(1.0, m / 8)  # seconds, roughly
            repeats = max(5, min(2000, int(seconds / estimate)))
            ours = median_time(lambda x=x, w=w: mx.eval(x @ w.T), repeats)
            ref = median_time(lambda x=x_np, w=w_np, o=out: blas.matmul_t(x, w, o), repeats)
            print(f"{name:>9} {f'{n}x{k}':>12} {m:3d} {ours * 1e6:9.0f} {ref * 1e6:9.0f}"
                  f" {ref / ours:5.2f}x")  # fmt: skip


def forward(blas: OpenBlas, rows: list[int], repeats: int, threads: int) -> None:
    """A whole forward's GEMMs per M, against streaming the same bytes."""
    import mlx.core as mx

    shapes = [s for _ in range(LAYERS) for s in PER_LAYER] + [HEAD]
    weights = [mx.full((n, k), 0.01) for _, n, k in shapes]
    mx.eval(weights)
    total = sum(n * k * 4 for _, n, k in shapes)
    rate = stream_rate(threads)
    floor = total / rate
    print(f"\nwhole forward: {len(shapes)} GEMMs, {total / 1e9:.2f} GB of weights")
    print(f"streaming floor: {rate / 1e9:.1f} GB/s on {threads} threads -> {floor * 1e3:.0f} ms")
    print(f"{'M':>3} {'MLX+shim ms':>12} {'x floor':>8} {'OpenBLAS ms':>12} {'x floor':>8}")
    for m in rows:
        a, b = forward_at(blas, m, shapes, weights, repeats)
        print(f"{m:3d} {a * 1e3:12.1f} {a / floor:7.2f}x {b * 1e3:12.1f} {b / floor:7.2f}x")


def forward_at(
    blas: OpenBlas, m: int, shapes: list[tuple[str, int, int]], weights: list[Any], repeats: int
) -> tuple[float, float]:
    """Median seconds of every weight GEMM at M = m: through MLX, and direct."""
    import mlx.core as mx
    import numpy as np

    xs = {k: mx.random.normal((m, k)) for k in (896, 4864)}
    mx.eval(list(xs.values()))
    xs_np = {k: np.asarray(memoryview(x)) for k, x in xs.items()}
    views = [np.asarray(memoryview(w)) for w in weights]
    outs = [np.empty((m, n), np.float32) for _, n, _ in shapes]

    def ours() -> None:
        mx.eval([xs[k] @ w.T for (_, _, k), w in zip(shapes, weights, strict=True)])

    def ref() -> None:
        for (_, _, k), w, out in zip(shapes, views, outs, strict=True):
            blas.matmul_t(xs_np[k], w, out)

    return median_time(ours, repeats), median_time(ref, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,4,16,64", help="M values per call")
    parser.add_argument("--forward-rows", default="1,4,16,64", help="M values, whole forward")
    parser.add_argument("--repeats", type=int, default=7, help="whole-forward repeats")
    parser.add_argument("--call-seconds", type=float, default=0.3, help="budget per call case")
    args = parser.parse_args()
    info = load_fast_blas()
    import mlx.core as mx

    mx.set_default_device(mx.cpu)
    print(describe(info))
    threads = threads_of()
    blas = OpenBlas(info)
    if args.rows:
        per_call(blas, [int(m) for m in args.rows.split(",")], args.call_seconds)
    if args.forward_rows:
        forward(blas, [int(m) for m in args.forward_rows.split(",")], args.repeats, threads)


def threads_of() -> int:
    """Threads the shim's kernel runs on (the streaming floor uses as many)."""
    fn = getattr(ctypes.CDLL(None), "mlxcel_blas_shim_threads", None)
    return int(fn()) if fn is not None else len(os.sched_getaffinity(0))


if __name__ == "__main__":
    main()
