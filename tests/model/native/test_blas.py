"""Fast-BLAS routing for MLX on Linux, checked in fresh interpreters.

Each check runs in a subprocess: the reroute only works before ``mlx.core``
is first imported, which the test process may already have done.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mlxcel.model.native.blas import build_shim

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="BLAS rerouting is Linux-only"
)

PROBE = """
import json, sys
from mlxcel.model.native.blas import load_fast_blas
if "late" in sys.argv:
    import mlx.core
info = load_fast_blas()
assert load_fast_blas() is info
import ctypes
import mlx.core
import mlx.core as mx
a = mx.ones((64, 64))
mx.eval(a @ a)  # MLX's GEMM has run, so its cblas_sgemm binding is settled
# Which library answers `cblas_sgemm` in the process's global scope: MLX's lookup
# goes through that scope before its own reference BLAS.
try:
    resolved = ctypes.cast(ctypes.CDLL(None).cblas_sgemm, ctypes.c_void_p).value
except AttributeError:  # no global cblas_sgemm: MLX uses its own reference BLAS
    resolved = None
shim = None
if info.path is not None and resolved is not None:
    for line in open("/proc/self/maps"):
        if "blas" in line and ("shim" in line or info.path in line):
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= resolved < hi:
                shim = line.split()[-1]
print(json.dumps({"name": info.name, "fast": info.fast, "path": info.path, "note": info.note,
                  "sgemm_from": shim}))
"""


def _probe(*args: str, **env: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert isinstance(data, dict)
    return data


def test_openblas_makes_mlx_matmul_fast(tmp_path: Path) -> None:
    # One OpenBLAS thread: with several threads on a busy machine OpenBLAS's
    # spinning workers can fall to reference speed, which would make this
    # test about the machine's load rather than about the reroute.
    fast = _probe(MLXCEL_CACHE_DIR=str(tmp_path), OPENBLAS_NUM_THREADS="1")
    reference = _probe(MLXCEL_BLAS="reference")
    assert fast["fast"] is True, fast
    assert fast["name"].startswith("openblas"), fast
    assert reference == {**reference, "name": "reference", "fast": False, "path": None}
    # MLX's cblas_sgemm resolves into the shim. (Speed is measured by bench/, not
    # asserted here: about 200 GFLOP/s against 5 for the reference BLAS.)
    assert fast["sgemm_from"] is not None
    assert "mlxcel-blas-shim" in fast["sgemm_from"], fast
    assert reference["sgemm_from"] is None
    assert list((tmp_path / "native").glob("mlxcel-blas-shim-*.so"))


def test_late_call_is_reported() -> None:
    late = _probe("late")
    assert "imported before" in late["note"]
    assert late["fast"] is False


def test_unusable_forced_library_falls_back_to_reference(tmp_path: Path) -> None:
    info = _probe(MLXCEL_BLAS=str(tmp_path / "missing.so"))
    assert (info["name"], info["fast"]) == ("reference", False)
    assert "MLXCEL_BLAS" in info["note"]


def test_shim_build_is_cached_per_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLXCEL_CACHE_DIR", str(tmp_path))
    openblas = importlib.import_module("scipy_openblas32")
    lib = Path(openblas.get_lib_dir()) / openblas.get_library(fullname=True)
    first = build_shim(lib)
    stamp = first.stat().st_mtime_ns
    assert build_shim(lib) == first
    assert first.stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no temp files left
