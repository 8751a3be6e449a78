"""Fixtures of the native code's tests: the CPU kernels' extension built once per
instruction set per test run (each build takes a compiler run of about ten seconds), in
the run's own temporary directory rather than the user cache."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest


@pytest.fixture(scope="session")
def kernels_for(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], ModuleType]:
    """Builds (once) and imports the extension for an instruction set."""
    built: dict[str, ModuleType] = {}

    def get(isa: str) -> ModuleType:
        if isa not in built:
            from mlxcel.model.native.blas import load_fast_blas

            load_fast_blas()  # before mlx.core is imported by the modules below
            from mlxcel.model.native.build import build_kernels
            from mlxcel.model.native.kernels import import_extension

            path = build_kernels(isa, out_dir=tmp_path_factory.mktemp(f"kernels-{isa}"))
            built[isa] = import_extension(path)
            assert built[isa].isa() == isa
        return built[isa]

    return get
