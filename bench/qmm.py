"""The quantized matmul kernel (model/native/qmm_kernel.c) against MLX, per shape and per model pass.

Per shape of the default model (Qwen2.5-Coder-0.5B: hidden 896, MLP 4864, KV 128, vocabulary
151936) and rows M of x: microseconds per call of our kernel, of MLX's own
`mx.quantized_matmul`, and of a float32 `x @ W.T` through MLX with the fast BLAS, plus
our kernel's effective GB/s over the bytes the quantized weights occupy (packed values,
scales and biases). Then a whole-model pass (24 layers of distinct weights plus the head,
so nothing stays in cache) against the time to merely read the same bytes with the same
number of threads: the streaming floor. Prints figures; asserts nothing.

    .venv/bin/python bench/qmm.py [--isa avx512|avx2|generic] [--threads N] [--quick]
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

import numpy as np

from mlxcel.model.native.blas import describe, load_fast_blas
from mlxcel.model.native.build import build_qmm_library, compilers, probe
from mlxcel.model.native.qmm_lib import Kernel

HIDDEN, MLP, KV, VOCAB, LAYERS = 896, 4864, 128, 151936, 24
#: (name, N, K, bits) per call shape; group size 32 throughout (as converted from GGUF).
SHAPES = [
    ("q/o", HIDDEN, HIDDEN, 5), ("k/v", KV, HIDDEN, 5), ("v (8-bit half)", KV, HIDDEN, 8),
    ("gate/up", MLP, HIDDEN, 5), ("down", HIDDEN, MLP, 5), ("down (4-bit half)", HIDDEN, MLP, 4),
    ("head", VOCAB, HIDDEN, 8),
]  # fmt: skip
GROUP = 32
Quant = tuple[np.ndarray, np.ndarray, np.ndarray, int]

STREAM_C = r"""
#include <immintrin.h>
#include <pthread.h>
#include <stddef.h>
typedef struct { const char **b; const size_t *n; int nb, nt, t; float out; } arg_t;
static void *rd(void *p) {
  arg_t *a = p; __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (int i = 0; i < a->nb; i++) {
    size_t per = (a->n[i] / a->nt) & ~(size_t)127, n = a->t == a->nt - 1 ? a->n[i] - a->t * per : per;
    const float *f = (const float *)(a->b[i] + a->t * per);
    for (size_t j = 0; j + 32 <= n / 4; j += 32) {
      s0 = _mm256_add_ps(s0, _mm256_loadu_ps(f + j)); s1 = _mm256_add_ps(s1, _mm256_loadu_ps(f + j + 8));
      s2 = _mm256_add_ps(s2, _mm256_loadu_ps(f + j + 16)); s3 = _mm256_add_ps(s3, _mm256_loadu_ps(f + j + 24));
    }
  }
  float o[8]; _mm256_storeu_ps(o, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  a->out = o[0]; return NULL;
}
double stream_read(const char **b, const size_t *n, int nb, int nt) {
  pthread_t th[64]; arg_t a[64]; double s = 0;
  for (int t = 0; t < nt; t++) { a[t] = (arg_t){b, n, nb, nt, t, 0}; if (t) pthread_create(&th[t], 0, rd, &a[t]); }
  rd(&a[0]); for (int t = 1; t < nt; t++) pthread_join(th[t], 0);
  for (int t = 0; t < nt; t++) s += a[t].out; return s;
}
"""


def median_time(call: Callable[[], object], budget: float = 0.25, runs: int = 5) -> float:
    """Median seconds per call over `runs` runs, each repeating the call for ~budget/runs."""
    call()  # warm-up: page faults, thread pool, caches
    start = time.perf_counter()
    call()
    once = max(time.perf_counter() - start, 1e-7)
    reps = max(1, int(budget / runs / once))
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(reps):
            call()
        samples.append((time.perf_counter() - start) / reps)
    return statistics.median(samples)


def quantize(n: int, k: int, bits: int, rng: np.random.Generator) -> Quant:
    import mlx.core as mx

    w = mx.array(rng.standard_normal((n, k), dtype=np.float32) * 0.02)
    q, s, b = mx.quantize(w, group_size=GROUP, bits=bits)
    return np.array(q), np.array(s), np.array(b), bits


def nbytes(w: Quant) -> int:
    return w[0].nbytes + w[1].nbytes + w[2].nbytes


#: MLX's own quantized_matmul runs at ~0.5 GMAC/s here: above this many multiply-adds
#: per call (the head at M >= 16) it is not timed.
MLX_QMM_MAX_MACS = 2e9


def mlx_time(x: np.ndarray, w: Quant, reps: int) -> tuple[float, float]:
    """Seconds per call of mx.quantized_matmul (NaN when too slow to time) and of float32
    x @ W.T, R calls per eval."""
    import mlx.core as mx

    xq = mx.array(x)
    q, s, b = (mx.array(a) for a in w[:3])
    bits = w[3]
    wf = mx.dequantize(q, s, b, group_size=GROUP, bits=bits)
    mx.eval(xq, q, s, b, wf)

    def quant() -> None:
        mx.eval(*[mx.quantized_matmul(xq, q, s, b, True, GROUP, bits) for _ in range(reps)])

    def dense() -> None:
        mx.eval(*[xq @ wf.T for _ in range(reps)])

    macs = x.shape[0] * w[0].shape[0] * x.shape[1]
    quant_time = median_time(quant, runs=3) / reps if macs <= MLX_QMM_MAX_MACS else float("nan")
    return quant_time, median_time(dense, runs=3) / reps


def per_shape(kern: Kernel, ms: list[int], shapes: list[Any], rng: np.random.Generator) -> None:
    print(f"\n{'shape':<18} {'N x K':>12} {'bits':>4} {'M':>4} {'ours us':>10} {'mlx q us':>10}"
          f" {'f32 us':>10} {'ours GB/s':>10} {'x mlx q':>8} {'x f32':>7}")  # fmt: skip
    for name, n, k, bits in shapes:
        w = quantize(n, k, bits, rng)
        for m in ms:
            x = rng.standard_normal((m, k), dtype=np.float32)
            y = np.empty((m, n), np.float32)
            ours = median_time(kern.prepare(x, w[0], w[1], w[2], bits, GROUP, y))
            reps = max(1, min(32, int(2e8 / max(1, n * k * m))))
            mq, f32 = mlx_time(x, w, reps)
            print(f"{name:<18} {f'{n}x{k}':>12} {bits:>4} {m:>4} {ours * 1e6:>10.1f} {mq * 1e6:>10.1f}"
                  f" {f32 * 1e6:>10.1f} {nbytes(w) / ours / 1e9:>10.1f} {mq / ours:>8.1f}"
                  f" {f32 / ours:>7.1f}")  # fmt: skip


def model_weights(rng: np.random.Generator) -> list[Quant]:
    """24 layers (q, k, v, o, gate, up, down) of distinct weights, then the head."""
    layers: list[Quant] = []
    for i in range(LAYERS):
        v_bits, down_bits = (8, 6) if i % 2 else (5, 4)  # GGUF Q4_K_M mixes these per layer
        for n, k, bits in [(HIDDEN, HIDDEN, 5), (KV, HIDDEN, 5), (KV, HIDDEN, v_bits),
                           (HIDDEN, HIDDEN, 5), (MLP, HIDDEN, 5), (MLP, HIDDEN, 5),
                           (HIDDEN, MLP, down_bits)]:  # fmt: skip
            layers.append(quantize(n, k, bits, rng))
    return [*layers, quantize(VOCAB, HIDDEN, 8, rng)]


def stream_reader(tmp: Path, weights: list[Quant], threads: int) -> Callable[[], object]:
    """A call reading every weight byte once on `threads` threads."""
    src = tmp / "stream.c"
    src.write_text(STREAM_C)
    lib_path = tmp / "stream.so"
    cc = compilers().cc
    subprocess.run([cc, "-O2", "-mavx2", "-shared", "-fPIC", "-o", str(lib_path), str(src),
                    "-lpthread"], check=True)  # fmt: skip
    lib = ctypes.CDLL(str(lib_path))
    lib.stream_read.restype = ctypes.c_double
    arrays = [a for w in weights for a in w[:3]]
    ptrs = (ctypes.c_char_p * len(arrays))(*[ctypes.c_char_p(a.ctypes.data) for a in arrays])
    sizes = (ctypes.c_size_t * len(arrays))(*[a.nbytes for a in arrays])
    return lambda: lib.stream_read(ptrs, sizes, len(arrays), threads)


def model_pass(kern: Kernel, ms: list[int], threads: int, tmp: Path, mlx_ms: list[int],
               rng: np.random.Generator) -> None:  # fmt: skip
    weights = model_weights(rng)
    total = sum(nbytes(w) for w in weights)
    floor = median_time(stream_reader(tmp, weights, threads), budget=1.0)
    print(
        f"\nwhole model pass: {len(weights)} calls, {total / 1e6:.0f} MB of weights;"
        f" streaming floor {floor * 1e3:.1f} ms ({total / floor / 1e9:.1f} GB/s, {threads} threads)"
    )
    for m in ms:
        xs = {k: rng.standard_normal((m, k), dtype=np.float32) for k in (HIDDEN, MLP)}
        calls = []
        for q, s, b, bits in weights:
            y = np.empty((m, q.shape[0]), np.float32)
            calls.append(kern.prepare(xs[q.shape[1] * 32 // bits], q, s, b, bits, GROUP, y))
        ours = median_time(lambda calls=calls: [c() for c in calls], budget=2.0)
        line = (
            f"  M={m:<4} ours {ours * 1e3:8.1f} ms = {total / ours / 1e9:5.1f} GB/s,"
            f" {ours / floor:4.2f}x the floor, {ours / m * 1e3:7.2f} ms per row"
        )
        if m in mlx_ms:
            line += f"; mlx quantized_matmul {mlx_pass(weights, xs) * 1e3:8.1f} ms"
        print(line)


def mlx_pass(weights: list[Quant], xs: dict[int, np.ndarray]) -> float:
    import mlx.core as mx

    arrs = [(mx.array(q), mx.array(s), mx.array(b), bits) for q, s, b, bits in weights]
    mxs = {k: mx.array(v) for k, v in xs.items()}
    mx.eval(mxs, [a[:3] for a in arrs])

    def run() -> None:
        mx.eval(*[mx.quantized_matmul(mxs[q.shape[1] * 32 // bits], q, s, b, True, GROUP, bits)
                  for q, s, b, bits in arrs])  # fmt: skip

    return median_time(run, budget=1.0, runs=3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--isa", choices=["avx512", "avx2", "generic"], default=None)
    parser.add_argument("--threads", type=int, default=0, help="kernel threads (0: default)")
    parser.add_argument("--quick", action="store_true", help="fewer shapes and rows")
    parser.add_argument("--skip-shapes", action="store_true")
    parser.add_argument("--skip-model", action="store_true")
    args = parser.parse_args()
    blas = load_fast_blas()  # before anything imports mlx.core
    cpu = probe()
    isa = args.isa or cpu.isa
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        kern = Kernel.load(build_qmm_library(isa, tmp))
        kern.set_threads(args.threads)
        threads = kern.threads
        amx = isa == "avx512" and cpu.amx and os.environ.get("MLXCEL_QMM_AMX") != "0"
        pool = "the BLAS shim's pool" if kern.pool_shared else "its own pool"
        print(f"{cpu.describe()}: kernel build {kern.isa}{' with AMX from M = 5' if amx else ''},"
              f" {threads} threads ({pool}); {describe(blas)}")  # fmt: skip
        ms = [1, 16] if args.quick else [1, 4, 16, 64, 600]
        if not args.skip_shapes:
            per_shape(kern, ms, SHAPES[::3] if args.quick else SHAPES, rng)
        if not args.skip_model:
            model_pass(kern, [1, 16] if args.quick else [1, 4, 16, 64], threads, tmp, [1], rng)


if __name__ == "__main__":
    main()
