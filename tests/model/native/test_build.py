"""Building the BLAS shim: the instruction set chosen, and one cache file per build."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from mlxcel.model.native import build as blas_build

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="BLAS rerouting is Linux-only"
)

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu sse sse2 {extra}
bogomips\t: 5199.99

processor\t: 1
flags\t\t: fpu sse sse2 avx512f avx2 fma
"""


@pytest.mark.parametrize(
    ("extra", "isa"),
    [
        ("avx avx2 fma avx512f avx512bw avx512vl", "avx512"),
        ("avx avx2 fma avx512f", "avx2"),  # AVX-512 without BW and VL: the kernels need them
        ("avx avx2 fma", "avx2"),
        ("avx avx2", "generic"),  # AVX2 without FMA: the kernel needs both
        ("avx fma", "generic"),
        ("", "generic"),
    ],
)
def test_isa_from_the_first_flags_line(extra: str, isa: str) -> None:
    assert blas_build.cpu_isa(CPUINFO.format(extra=extra)) == isa


def test_isa_can_be_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLXCEL_BLAS_ISA", "generic")
    assert blas_build.chosen_isa() == "generic"
    monkeypatch.setenv("MLXCEL_BLAS_ISA", " AVX2 ")
    assert blas_build.chosen_isa() == "avx2"
    monkeypatch.setenv("MLXCEL_BLAS_ISA", "sse9")  # unknown: detected instead
    assert blas_build.chosen_isa() == blas_build.cpu_isa()


def _openblas() -> Path:
    mod = importlib.import_module("scipy_openblas32")
    return Path(mod.get_lib_dir()) / mod.get_library(fullname=True)


def test_each_build_has_its_own_cached_file(tmp_path: Path) -> None:
    detected = blas_build.cpu_isa()
    generic = blas_build.build(_openblas(), tmp_path, "generic")
    wide = blas_build.build(_openblas(), tmp_path, detected)
    assert generic.name.startswith("mlxcel-blas-shim-generic-")
    assert wide.name.startswith(f"mlxcel-blas-shim-{detected}-")
    assert (generic == wide) == (detected == "generic")
    stamp = generic.stat().st_mtime_ns
    assert blas_build.build(_openblas(), tmp_path, "generic") == generic
    assert generic.stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert sorted(tmp_path.iterdir()) == sorted({generic, wide})  # no temporary files


def test_name_changes_with_flags_and_compiler() -> None:
    names = {
        blas_build.shim_name(_openblas(), isa, compiler)
        for isa in blas_build.ISA_FLAGS
        for compiler in ("/usr/bin/gcc", "/usr/bin/clang")
    }
    assert len(names) == 2 * len(blas_build.ISA_FLAGS)


def test_failed_build_raises_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    monkeypatch.delenv("MLXCEL_BLAS_ISA", raising=False)
    with pytest.raises(blas_build.ShimBuildError, match="shim build"):
        blas_build.build_best(_openblas(), tmp_path)
    assert list(tmp_path.iterdir()) == []
