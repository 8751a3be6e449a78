"""The CPU quantized matmul as an MLX primitive: same products as MLX's, and a clean fallback.

Every build this CPU can run (AVX-512, AVX2, and the plain C one) is compiled into the
run's own directory (``conftest.py``) and compared with ``mx.dequantize`` followed by a float32 matmul,
for every bits/group pair, row counts from 1 to 600, odd shapes and strided inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from mlxcel.model.native.blas import load_fast_blas

load_fast_blas()  # before mlx.core is imported below

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402

from mlxcel.model.native import kernels, qmm  # noqa: E402
from mlxcel.model.native.build import probe  # noqa: E402

pytestmark = pytest.mark.mlx

ISAS = [isa for isa in ("avx512", "avx2") if probe().runs(isa)] + ["generic"]
BITS = (4, 5, 8)
GROUPS = (32, 64, 128)
ROWS = (1, 2, 3, 7, 16, 33, 64, 600)


@pytest.fixture(scope="module", params=ISAS)
def ext(request: pytest.FixtureRequest, kernels_for: Callable[[str], ModuleType]) -> ModuleType:
    return kernels_for(request.param)


def quantized(n: int, k: int, bits: int, group: int, seed: int = 0) -> tuple[mx.array, ...]:
    weights = mx.random.normal((n, k), key=mx.random.key(seed)) * 0.1
    return tuple(mx.quantize(weights, group_size=group, bits=bits))


def reference(
    x: mx.array, w: mx.array, s: mx.array, b: mx.array, group: int, bits: int
) -> mx.array:
    dense = mx.dequantize(w, s, b, group_size=group, bits=bits)
    return x @ dense.T


def assert_close(ours: mx.array, theirs: mx.array) -> None:
    assert ours.shape == theirs.shape
    assert ours.dtype == mx.float32
    scale = max(1.0, mx.abs(theirs).max().item())
    assert mx.abs(ours - theirs).max().item() <= 2e-5 * scale


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("group", GROUPS)
def test_every_bits_group_pair_and_row_count(ext: ModuleType, bits: int, group: int) -> None:
    w, s, b = quantized(67, 384, bits, group)
    for rows in ROWS:
        x = mx.random.normal((rows, 384), key=mx.random.key(rows))
        assert_close(
            ext.quantized_matmul(x, w, s, b, group, bits), reference(x, w, s, b, group, bits)
        )


@pytest.mark.parametrize(("n", "k"), [(1, 32), (3, 64), (1000, 896), (896, 4864)])
def test_odd_and_model_shapes(ext: ModuleType, n: int, k: int) -> None:
    for bits in BITS:
        w, s, b = quantized(n, k, bits, 32, seed=n)
        for rows in (1, 5, 40):
            x = mx.random.normal((rows, k), key=mx.random.key(k + rows))
            assert_close(
                ext.quantized_matmul(x, w, s, b, 32, bits), reference(x, w, s, b, 32, bits)
            )


def test_leading_axes_strided_inputs_and_no_rows(ext: ModuleType) -> None:
    w, s, b = quantized(130, 256, 5, 32)
    x = mx.random.normal((2, 3, 256), key=mx.random.key(7))
    assert_close(ext.quantized_matmul(x, w, s, b, 32, 5), reference(x, w, s, b, 32, 5))
    transposed = mx.random.normal((256, 9), key=mx.random.key(8)).T
    assert_close(
        ext.quantized_matmul(transposed, w, s, b, 32, 5), reference(transposed, w, s, b, 32, 5)
    )
    every_other = (w[::2], s[::2], b[::2])
    assert_close(
        ext.quantized_matmul(transposed, *every_other, 32, 5),
        reference(transposed, *every_other, 32, 5),
    )
    empty = ext.quantized_matmul(mx.zeros((0, 256)), w, s, b, 32, 5)
    assert empty.shape == (0, 130)


def test_what_it_does_not_take_is_refused(ext: ModuleType) -> None:
    w, s, b = quantized(8, 64, 4, 32)
    x = mx.ones((1, 64))
    with pytest.raises(ValueError, match="unsupported bits"):
        ext.quantized_matmul(x, w, s, b, 32, 7)
    with pytest.raises(ValueError, match="float32"):
        ext.quantized_matmul(x.astype(mx.float16), w, s, b, 32, 4)
    with pytest.raises(ValueError, match="packed width"):
        ext.quantized_matmul(mx.ones((1, 96)), w, s, b, 32, 4)
    with pytest.raises(ValueError, match="scales and biases"):
        ext.quantized_matmul(x, w, s[:4], b, 32, 4)


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(300, 64)
        self.proj = nn.Linear(64, 64, bias=True)
        self.gate = nn.Linear(64, 128, bias=False)

    def __call__(self, tokens: mx.array) -> mx.array:
        h = self.gate(self.proj(self.embed(tokens)))
        return self.embed.as_linear(h[..., :64])


@pytest.fixture
def fresh_status() -> Iterator[None]:
    saved = kernels._status
    kernels._status = None
    yield
    kernels._status = saved


def tiny_model() -> Tiny:
    model = Tiny()
    nn.quantize(model, group_size=32, bits=5)
    mx.eval(model.parameters())
    return model


@pytest.mark.usefixtures("fresh_status")
def test_a_quantized_model_computes_the_same_through_the_kernel() -> None:
    model = tiny_model()
    tokens = mx.array([[1, 5, 299, 42]])
    before = model(tokens)
    assert qmm.install_quantized_forms(model) == 3
    assert type(model.proj) is qmm.CpuQuantizedLinear
    assert_close(model(tokens), before)
    qmm.uninstall_quantized_forms(model)
    assert type(model.proj) is nn.QuantizedLinear


@pytest.mark.usefixtures("fresh_status")
def test_without_the_kernel_models_keep_mlx_own_path_and_say_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MLXCEL_CPU_ISA", raising=False)
    monkeypatch.setenv("MLXCEL_QMM_ISA", "off")
    model = tiny_model()
    tokens = mx.array([[3, 4]])
    before = model(tokens)
    assert qmm.install_quantized_forms(model) == 0
    assert kernels.load_kernels().describe() == "MLX's own operations (MLXCEL_CPU_ISA=off)"
    assert type(model.proj) is nn.QuantizedLinear
    assert mx.array_equal(model(tokens), before).item()


@pytest.mark.usefixtures("fresh_status")
def test_a_build_that_fails_falls_back(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MLXCEL_CPU_ISA", "generic")
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr("mlxcel.model.native.build.shutil.which", lambda name: None)
    status = kernels.load_kernels()
    assert not status.available
    assert "could not be built" in status.note
