"""The CPU attention and SwiGLU kernels (model/native/attn_kernel.c) as MLX primitives, against
mlx-lm's and MLX's own.

Every build this CPU can run (AVX-512, AVX2, plain C) is compiled once per test run
(``conftest.py``). Attention must equal mlx-lm's ``scaled_dot_product_attention`` (MLX's
fused op) within float32 rounding for every mask kind mlx-lm passes, grouped heads, one
and many queries, key counts on and off the kernel's 64-key blocks, batches with left
padding, rows that see no key, and strided inputs; SwiGLU must equal ``silu(g) * u``.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from mlxcel.model.native.blas import load_fast_blas
from mlxcel.model.native.build import probe

pytestmark = pytest.mark.mlx

load_fast_blas()  # before mlx.core is imported below

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
from mlx_lm.models.base import create_causal_mask  # noqa: E402

from mlxcel.model.native.cpu_forms import REFERENCE_SDPA  # noqa: E402

ISAS = [isa for isa in ("avx512", "avx2") if probe().runs(isa)] + ["generic"]
FLOAT32_MIN = float(mx.finfo(mx.float32).min)


@pytest.fixture(scope="module", params=ISAS)
def ext(request: pytest.FixtureRequest, kernels_for: Callable[[str], ModuleType]) -> ModuleType:
    return kernels_for(request.param)


def kernel(ext: ModuleType, q: mx.array, k: mx.array, v: mx.array, mask: Any) -> mx.array:
    if mask is None or isinstance(mask, str):
        out: mx.array = ext.attention(q, k, v, 0.125, causal=mask == "causal")
    else:
        out = ext.attention(q, k, v, 0.125, mask=mask)
    return out


def assert_matches(
    ours: mx.array, q: mx.array, k: mx.array, v: mx.array, mask: Any, tolerance: float = 1e-5
) -> None:
    """Within float32 rounding of mlx-lm's attention, NaN exactly where it has NaN."""
    theirs = REFERENCE_SDPA(q, k, v, cache=None, scale=0.125, mask=mask)
    assert ours.shape == theirs.shape
    assert ours.dtype == mx.float32
    nan = mx.isnan(theirs)
    assert mx.array_equal(mx.isnan(ours), nan).item()
    gap = mx.abs(mx.where(nan, 0.0, ours) - mx.where(nan, 0.0, theirs)).max().item()
    assert gap <= tolerance * max(1.0, mx.abs(mx.where(nan, 0.0, theirs)).max().item())


def qkv(
    batch: int, heads: int, kv_heads: int, q_len: int, k_len: int, dim: int = 64, seed: int = 0
) -> tuple[mx.array, mx.array, mx.array]:
    key = mx.random.key(seed)
    kq, kk, kv = mx.random.split(key, 3)
    return (
        mx.random.normal((batch, heads, q_len, dim), key=kq),
        mx.random.normal((batch, kv_heads, k_len, dim), key=kk),
        mx.random.normal((batch, kv_heads, k_len, dim), key=kv),
    )


def masks(batch: int, heads: int, q_len: int, k_len: int) -> dict[str, Any]:
    """Every mask kind, each leaving every row at least one key (key 0)."""
    rng = np.random.default_rng(q_len * 1000 + k_len)
    seen = rng.random((batch, 1, q_len, k_len)) < 0.6
    seen[..., 0] = True
    per_head = rng.random((batch, heads, q_len, k_len)) < 0.6
    per_head[..., 0] = True
    return {
        "none": None,
        "causal": "causal",
        "bool": mx.array(seen),
        "bool per head": mx.array(per_head),
        "bool 2-d": mx.array(seen[0, 0]),
        "additive -inf": mx.where(mx.array(seen), 0.0, -mx.inf),
        "additive float32 min": mx.where(mx.array(seen), 0.0, FLOAT32_MIN),
        "additive values": mx.array(rng.normal(size=(1, heads, q_len, k_len)).astype(np.float32)),
    }


SHAPES = [  # batch, query heads, key heads, queries, keys, width
    (1, 14, 2, 256, 700, 64),  # a prompt chunk against a longer context, GQA 7:1
    (2, 14, 2, 1, 513, 64),  # decode rows, keys one past a block
    (3, 4, 4, 17, 33, 128),  # no grouping, the wide heads
    (1, 2, 1, 5, 3, 80),  # fewer keys than queries; a width off the vector length
    (2, 8, 2, 70, 130, 64),
    (1, 6, 3, 9, 1, 32),  # a single key
]


MASKS = list(masks(1, 1, 1, 1))


@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_mask_kind_matches_the_reference(
    ext: ModuleType, shape: tuple[int, ...], kind: str
) -> None:
    batch, heads, kv_heads, q_len, k_len, dim = shape
    q, k, v = qkv(batch, heads, kv_heads, q_len, k_len, dim)
    mask = masks(batch, heads, q_len, k_len)[kind]
    assert_matches(kernel(ext, q, k, v, mask), q, k, v, mask)


@pytest.mark.parametrize("batch", [1, 16, 64])
@pytest.mark.parametrize("k_len", [1, 64, 511, 2048])
def test_decode_rows_match(ext: ModuleType, batch: int, k_len: int) -> None:
    q, k, v = qkv(batch, 14, 2, 1, k_len, seed=batch + k_len)
    assert_matches(kernel(ext, q, k, v, None), q, k, v, None)


@pytest.mark.parametrize(("q_len", "offset"), [(1, 40), (12, 20), (16, 0), (100, 37)])
def test_left_padded_batches_match_even_where_rows_see_no_key(
    ext: ModuleType, q_len: int, offset: int
) -> None:
    """The masks mlx-lm's batched KV cache builds: causal, with each row's left padding.

    With padding 15 on a 16-token prefill the padded queries see no key at all: MLX's
    softmax over equal float32-min scores then averages every value, and so must the kernel.
    """
    left = mx.array([0, 3, 15])
    mask = create_causal_mask(q_len, offset=offset, left_padding=left)
    q, k, v = qkv(3, 14, 2, q_len, offset + q_len, seed=q_len)
    ours = kernel(ext, q, k, v, mask)
    assert_matches(ours, q, k, v, mask)
    assert mx.all(mx.isfinite(ours)).item()


def test_rows_that_see_no_key(ext: ModuleType) -> None:
    q, k, v = qkv(1, 4, 2, 6, 150)
    blind = np.ones((1, 1, 6, 150), dtype=bool)
    blind[0, 0, 2] = False  # one row sees nothing
    blind[0, 0, 4, :100] = False  # one sees only its last block
    boolean = mx.array(blind)
    ours = kernel(ext, q, k, v, boolean)
    assert_matches(ours, q, k, v, boolean)
    mean = mx.repeat(v.mean(axis=2), 2, axis=1)
    assert mx.allclose(ours[:, :, 2], mean, atol=1e-5).item()
    additive = mx.where(boolean, 0.0, -mx.inf)  # MLX gives NaN there, and so must the kernel
    ours = kernel(ext, q, k, v, additive)
    assert_matches(ours, q, k, v, additive)
    assert mx.all(mx.isnan(ours[:, :, 2])).item()
    # causal with more queries than keys: the first queries precede every key
    q, k, v = qkv(2, 4, 2, 9, 4)
    assert_matches(kernel(ext, q, k, v, "causal"), q, k, v, "causal")


def test_strided_inputs(ext: ModuleType) -> None:
    """A KV cache's slice, queries transposed from the projection, a transposed key
    layout (copied: the last axis is not contiguous) and a broadcast mask."""
    cache_k = mx.random.normal((2, 2, 300, 64), key=mx.random.key(1))
    cache_v = mx.random.normal((2, 2, 300, 64), key=mx.random.key(2))
    k, v = cache_k[:, :, :130], cache_v[:, :, :130]
    q = mx.random.normal((2, 20, 14, 64), key=mx.random.key(3)).transpose(0, 2, 1, 3)
    for mask in (None, "causal", create_causal_mask(20, offset=110)):
        assert_matches(kernel(ext, q, k, v, mask), q, k, v, mask)
    k_t = mx.random.normal((2, 2, 64, 130), key=mx.random.key(4)).swapaxes(-1, -2)
    assert_matches(kernel(ext, q, k_t, v, "causal"), q, k_t, v, "causal")


def test_large_scores_stay_finite_and_equal(ext: ModuleType) -> None:
    """Scores in the hundreds: each is rounded to ~1e-5 of itself, and a weight exp(s - max)
    moves by as much as its score does, so both sides agree only to a few ulp of the
    largest score, which the tolerance allows."""
    q, k, v = qkv(2, 8, 2, 7, 200)
    q, k = q * 12.0, k * 12.0
    top = (mx.abs(q * 0.125) @ mx.abs(mx.repeat(k, 4, axis=1)).swapaxes(-1, -2)).max().item()
    ours = kernel(ext, q, k, v, "causal")
    assert mx.all(mx.isfinite(ours)).item()
    assert_matches(ours, q, k, v, "causal", tolerance=4 * 1.2e-7 * top)


def test_what_it_does_not_take_is_refused(ext: ModuleType) -> None:
    q, k, v = qkv(1, 6, 4, 3, 10)
    with pytest.raises(ValueError, match="multiple"):
        ext.attention(q, k, v, 0.1)
    q, k, v = qkv(1, 4, 2, 3, 10)
    with pytest.raises(ValueError, match="float32"):
        ext.attention(q.astype(mx.float16), k, v, 0.1)
    with pytest.raises(ValueError, match="boolean or float32"):
        ext.attention(q, k, v, 0.1, mask=mx.zeros((3, 10), dtype=mx.int32))
    with pytest.raises(ValueError, match="not both"):
        ext.attention(q, k, v, 0.1, causal=True, mask=mx.zeros((3, 10)))
    with pytest.raises(ValueError, match=r"[Bb]roadcast"):
        ext.attention(q, k, v, 0.1, mask=mx.zeros((4, 10)))


def silu_times(gate: mx.array, up: mx.array) -> np.ndarray:
    g = np.array(gate, dtype=np.float64)
    with np.errstate(over="ignore"):
        return g / (1.0 + np.exp(-g)) * np.array(up, dtype=np.float64)


@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5, 4864), (2, 1, 4864 * 3 + 5)])
def test_swiglu_matches(ext: ModuleType, shape: tuple[int, ...]) -> None:
    gate = mx.random.normal(shape, key=mx.random.key(1)) * 8.0
    up = mx.random.normal(shape, key=mx.random.key(2))
    ours = ext.swiglu(gate, up)
    assert ours.shape == gate.shape
    assert mx.allclose(ours, nn.silu(gate) * up, rtol=1e-5, atol=1e-6).item()


def test_swiglu_exp_is_accurate_to_float32_rounding(ext: ModuleType) -> None:
    """silu(g) = g / (1 + e^-g) over the whole range of the exp, against float64: within
    a few ulp (an exp off by more would show), and finite where silu is."""
    gate = mx.array(np.linspace(-87.0, 88.0, 200_001, dtype=np.float32))
    ours = np.array(ext.swiglu(gate, mx.ones_like(gate)), dtype=np.float64)
    exact = silu_times(gate, mx.ones_like(gate))
    ulps = np.abs(ours - exact) / np.spacing(np.abs(exact).astype(np.float32))
    assert ulps.max() <= 4.0
    extremes = mx.array([-3.0e38, -1000.0, -104.0, -88.8, -20.0, 0.0, 20.0, 89.0, 1e30, 3e38])
    for up in (
        mx.ones_like(extremes),
        mx.full(extremes.shape, -2.5),
        mx.full(extremes.shape, 1e30),
    ):
        got = ext.swiglu(extremes, up)
        want = nn.silu(extremes) * up
        assert mx.array_equal(mx.isfinite(got), mx.isfinite(want)).item()
        assert mx.allclose(got, want, rtol=1e-6, atol=1e-30).item()


def test_swiglu_strided_and_refused(ext: ModuleType) -> None:
    both = mx.random.normal((9, 2 * 300), key=mx.random.key(3))
    gate, up = both[:, :300], both[:, 300:]  # halves of one projection: not contiguous
    assert mx.allclose(ext.swiglu(gate, up), nn.silu(gate) * up, atol=1e-6).item()
    assert mx.allclose(ext.swiglu(gate.T, up.T), nn.silu(gate.T) * up.T, atol=1e-6).item()
    with pytest.raises(ValueError, match="one shape"):
        ext.swiglu(gate, up[:, :10])
    with pytest.raises(ValueError, match="float32"):
        ext.swiglu(gate.astype(mx.float16), up)
