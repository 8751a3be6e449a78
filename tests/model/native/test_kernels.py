"""Loading the CPU kernels' extension: once per process, and never a kernel that fails its
self-check against MLX's own ops."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from mlxcel.model.native.blas import load_fast_blas

pytestmark = pytest.mark.mlx

load_fast_blas()  # before mlx.core is imported below

import mlx.core as mx  # noqa: E402

from mlxcel.model.native import kernels  # noqa: E402


@pytest.fixture
def fresh_status() -> Iterator[None]:
    saved = kernels._status
    kernels._status = None
    yield
    kernels._status = saved


def loading(monkeypatch: pytest.MonkeyPatch, module: Any) -> None:
    """Make the loader find `module` as the built extension."""
    monkeypatch.setenv("MLXCEL_CPU_ISA", "generic")
    monkeypatch.setattr(kernels, "build_kernels", lambda isa: Path(f"{isa}.so"))
    monkeypatch.setattr(kernels, "import_extension", lambda path: module)


def broken(real: ModuleType, name: str) -> SimpleNamespace:
    """The real kernels, but `name` off by a little."""
    kernels = {n: getattr(real, n) for n in ("quantized_matmul", "attention", "swiglu")}
    good = kernels[name]
    kernels[name] = lambda *args, **kwargs: good(*args, **kwargs) + 1e-2
    return SimpleNamespace(**kernels)


@pytest.mark.usefixtures("fresh_status")
@pytest.mark.parametrize("name", ["quantized_matmul", "attention", "swiglu"])
def test_a_kernel_that_computes_wrong_is_never_used(
    name: str,
    monkeypatch: pytest.MonkeyPatch,
    kernels_for: Callable[[str], ModuleType],
) -> None:
    loading(monkeypatch, broken(kernels_for("generic"), name))
    status = kernels.load_kernels()
    assert not status.available
    assert "self-check" in status.note
    assert status.describe().startswith("MLX's own operations (the generic kernels could not")
    assert kernels.current_module() is None


@pytest.mark.usefixtures("fresh_status")
def test_the_kernels_load_once_per_process(
    monkeypatch: pytest.MonkeyPatch, kernels_for: Callable[[str], ModuleType]
) -> None:
    real = kernels_for("generic")
    imports: list[Any] = []
    loading(monkeypatch, real)
    monkeypatch.setattr(kernels, "import_extension", lambda path: imports.append(path) or real)
    assert kernels.current_module() is None  # never loads by itself
    first = kernels.load_kernels()
    assert first.available
    assert first.isa == "generic"
    assert kernels.load_kernels() is first
    module = kernels.current_module()
    assert module is real
    assert len(imports) == 1
    q = mx.ones((1, 2, 3, 8))
    assert module.attention(q, q, q, 0.5).shape == (1, 2, 3, 8)
