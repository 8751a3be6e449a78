"""The native room's front door, ``accelerate()``: built from nothing into an empty user
cache for each instruction set this CPU runs (forced by ``MLXCEL_CPU_ISA``), the BLAS shim
and the kernels agree on the build and share one pool, and the record and its one log line
say what runs; ``off`` and a refused name are said too.

Each check runs in a fresh interpreter (the BLAS must load before ``mlx.core``) whose
``XDG_CACHE_HOME`` is the test's own folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mlxcel.model.native.build import probe

pytestmark = [
    pytest.mark.mlx,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the native code is Linux's"),
]

PROBE = """
import json, logging
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
from mlxcel.model.native import accelerate
first = accelerate()
assert accelerate() is first  # once per process
kernels = first.kernels
print(json.dumps({
    "blas": first.blas.name, "fell_back": first.fell_back, "gflops": first.gflops,
    "kernels": kernels.isa, "available": kernels.available, "note": kernels.note,
    "shared": kernels.module.pool_shared() if kernels.available else None,
}))
"""


def accelerate_in(cache: Path, **env: str) -> tuple[dict[str, Any], str]:
    """The record of a fresh process whose user cache is `cache`, and its log."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MLXCEL_")}
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**clean, "XDG_CACHE_HOME": str(cache), **env},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert isinstance(record, dict)
    return record, result.stderr


RUNS = [isa for isa in ("avx512", "avx2") if probe().runs(isa)] + ["generic"]


@pytest.mark.parametrize("isa", RUNS)
def test_built_from_nothing_for_each_instruction_set(isa: str, tmp_path: Path) -> None:
    record, log = accelerate_in(tmp_path, MLXCEL_CPU_ISA=isa)
    assert f"via shim, {isa} kernel" in record["blas"], record
    assert (record["kernels"], record["available"], record["shared"]) == (isa, True, True)
    assert record["fell_back"] is False
    assert record["gflops"] > 0
    built = sorted(p.name.rsplit("-", 1)[0] for p in (tmp_path / "mlxcel" / "native").iterdir())
    assert built == [f"mlxcel-blas-shim-{isa}", f"mlxcel-kernels-{isa}"]  # nothing else
    lines = [line for line in log.splitlines() if "CPU kernels:" in line]
    assert len(lines) == 1, log  # one line, once
    assert lines[0].startswith("INFO mlxcel.model.native CPU: ")
    assert "BLAS: openblas (scipy-openblas32 " in lines[0]
    assert f"CPU kernels: mlxcel's own ({isa}, on the BLAS shim's pool of " in lines[0]


def test_off_keeps_mlx_own_operations_and_says_so(tmp_path: Path) -> None:
    record, log = accelerate_in(tmp_path, MLXCEL_CPU_ISA="off")
    assert (record["available"], record["note"]) == (False, "MLXCEL_CPU_ISA=off")
    assert "via shim" in record["blas"]  # the BLAS is not the kernels: still fast
    assert record["fell_back"] is False  # asked for: said, not warned about
    assert "INFO mlxcel.model.native CPU: " in log
    assert "CPU kernels: MLX's own operations (MLXCEL_CPU_ISA=off)" in log
    assert [p.name.split("-")[1] for p in (tmp_path / "mlxcel" / "native").iterdir()] == ["blas"]


@pytest.mark.skipif(not probe().runs("avx2"), reason="needs a CPU the kernels are built for")
def test_a_refused_name_falls_back_to_the_cpus_own_build(tmp_path: Path) -> None:
    record, log = accelerate_in(tmp_path, MLXCEL_CPU_ISA="sse9")
    assert record["available"] is True
    assert record["kernels"] == probe().isa
    assert "MLXCEL_CPU_ISA='sse9' is not one of avx512, avx2, generic or off; ignored" in log
