"""The one thread pool of the native code (``model/native/pool.c``): the BLAS shim owns it,
the kernels' extension finds it when it loads and runs on it, so a process has one set of
workers whichever kernel calls; without the shim the extension runs its own.

The process-level checks run in fresh interpreters: the shim must be loaded before
``mlx.core`` is imported, and threads are counted in ``/proc/self/task``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from mlxcel.model.native.build import build_qmm_library, probe
from mlxcel.model.native.qmm_lib import Kernel

pytestmark = [
    pytest.mark.mlx,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the pool is Linux code"),
]

PROBE = """
import json, os, sys
from mlxcel.model.native.blas import load_fast_blas
info = load_fast_blas()
import mlx.core as mx
from mlxcel.model.native.kernels import import_extension

def threads():
    return len(os.listdir("/proc/self/task"))

ext = import_extension(sys.argv[1])
x = mx.random.normal((16, 1024), key=mx.random.key(0))
w = mx.random.normal((4096, 1024), key=mx.random.key(1))
q, s, b = mx.quantize(w, group_size=32, bits=4)
mx.eval(x, w, q, s, b)
mx.eval(x @ w.T)  # 16 rows: the shim's skinny kernel, on the pool when the shim is loaded
first = threads()
ours = ext.quantized_matmul(x, q, s, b, 32, 4)
mx.eval(ours)
theirs = mx.quantized_matmul(x, q, s, b, transpose=True, group_size=32, bits=4)
print(json.dumps({
    "blas": info.name, "shared": ext.pool_shared(), "threads": ext.pool_threads(),
    "added": threads() - first,
    "right": mx.allclose(ours, theirs, rtol=1e-4, atol=1e-3).item(),
}))
"""


def run_probe(extension: Path, **env: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(extension)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def extension(kernels_for: Callable[[str], ModuleType]) -> Path:
    """The kernels' extension built for the widest instruction set this CPU runs."""
    return Path(str(kernels_for(probe().isa).__file__))


def test_the_kernels_run_on_the_blas_shims_pool(extension: Path) -> None:
    """No second set of workers: the quantized matmul's call starts no thread after the
    shim's skinny kernel has started the pool, and the pool's size is the one set."""
    found = run_probe(extension, MLXCEL_CPU_THREADS="2")
    assert "via shim" in found["blas"], found
    assert found["shared"] is True
    assert found["threads"] == 2
    assert found["added"] == 0, found  # two pools added the kernels' own workers here
    assert found["right"] is True


def test_without_the_shim_the_extension_runs_its_own_pool(extension: Path) -> None:
    found = run_probe(extension, MLXCEL_BLAS="reference", MLXCEL_BLAS_THREADS="3")
    assert found["blas"] == "reference"
    assert found["shared"] is False
    assert found["threads"] == 3  # the older variable still sizes the pool
    assert found["added"] == 2  # its own workers, started by its first call
    assert found["right"] is True


def make_case(n: int, k: int, m: int, seed: int) -> tuple[np.ndarray, ...]:
    """x, the packed weights, scales and biases, the float64 product and its bound: 1e-5
    of the product of the row norms (float32 rounding, as the kernel's own tests)."""
    import mlx.core as mx

    w = mx.random.normal((n, k), key=mx.random.key(seed)) * 0.1
    q, s, b = mx.quantize(w, group_size=32, bits=5)
    dense = np.array(mx.dequantize(q, s, b, group_size=32, bits=5), dtype=np.float64)
    x = np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32)
    norms = np.linalg.norm(x, axis=1)[:, None] * np.linalg.norm(dense, axis=1)[None, :]
    return x, np.array(q), np.array(s), np.array(b), x.astype(np.float64) @ dense.T, 1e-5 * norms


def test_callers_on_several_threads_at_once_each_get_their_answer(tmp_path: Path) -> None:
    """One caller runs on the pool, the others alone on their own thread, each with its
    own scratch: every result is right, on every path (1, 16 and 200 rows)."""
    kern = Kernel.load(build_qmm_library(probe().isa, tmp_path))
    cases = [make_case(300 + 40 * i, 512, m, i) for i, m in enumerate((1, 16, 200, 1, 16, 200))]
    errors: list[BaseException] = []

    def run(x: Any, q: Any, s: Any, b: Any, want: Any, bound: Any) -> None:
        try:
            for _ in range(15):
                assert np.all(np.abs(kern.qmm(x, q, s, b, 5, 32) - want) <= bound)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=case) for case in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
