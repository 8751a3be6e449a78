"""The CPU forms against MLX's and mlx-lm's own ops: same numbers, same greedy tokens.

SwiGLU and attention are checked both ways they can run: through the compiled kernels
(``kernels``) and as composed MLX ops (the fallback without them).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from mlxcel.model.native.blas import load_fast_blas
from mlxcel.model.provision.fetch import default_model_dir, is_ready

from tiny_model import ensure_tiny_model

pytestmark = pytest.mark.mlx

load_fast_blas()  # before mlx.core is imported below

import mlx.core as mx  # noqa: E402
from mlx_lm.models import qwen2  # noqa: E402
from mlx_lm.models.base import create_causal_mask  # noqa: E402

from mlxcel.model.native import cpu_forms, kernels  # noqa: E402
from mlxcel.model.native.cpu_forms import (  # noqa: E402
    REFERENCE_SDPA,
    REFERENCE_SWIGLU,
    composed_forms,
    fast_log_softmax,
    fast_sdpa,
    fast_swiglu,
    install_cpu_forms,
    reference_forms,
    uninstall_cpu_forms,
)


@pytest.fixture(autouse=True)
def clean_install() -> Iterator[None]:
    uninstall_cpu_forms()
    mx.random.seed(7)
    yield
    uninstall_cpu_forms()


@pytest.fixture(params=["kernel", "composed"])
def forms(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs a test with the compiled kernels loaded, then with the composed MLX forms."""
    if request.param == "kernel":
        assert kernels.load_kernels().available
        yield request.param
    else:
        with composed_forms():
            yield request.param


def bound(name: str) -> Any:
    """What the qwen2 model module's global `name` is bound to now."""
    return vars(qwen2)[name]


def assert_close(got: mx.array, want: mx.array, atol: float, rtol: float = 1e-5) -> None:
    assert got.shape == want.shape
    assert got.dtype == want.dtype
    assert not bool(mx.any(mx.isnan(got)).item())
    assert bool(mx.allclose(got, want, rtol=rtol, atol=atol).item()), mx.max(mx.abs(got - want))


@pytest.mark.usefixtures("forms")
@pytest.mark.parametrize("shape", [(3,), (64, 1, 4864), (1, 37, 96), (2, 5, 1, 7)])
@pytest.mark.parametrize("spread", [1.0, 8.0])
def test_swiglu_matches_reference(shape: tuple[int, ...], spread: float) -> None:
    gate = mx.random.normal(shape) * spread
    up = mx.random.normal(shape)
    assert_close(fast_swiglu(gate, up), REFERENCE_SWIGLU(gate, up), atol=1e-6)


@pytest.mark.usefixtures("forms")
def test_swiglu_is_finite_and_exact_enough_at_extremes() -> None:
    gate = mx.array([-3.0e38, -1e30, -1000.0, -150.0, -88.0, -20.0, 0.0, 20.0, 88.0, 1e30, 3e38])
    for up in (mx.ones_like(gate), mx.full(gate.shape, 1e30), mx.full(gate.shape, -2.5)):
        got, want = fast_swiglu(gate, up), REFERENCE_SWIGLU(gate, up)
        assert bool(mx.all(mx.isfinite(got) | mx.isinf(want)).item())
        assert_close(got, want, atol=1e-6)


def sdpa_pair(
    batch: int, heads: int, kv_heads: int, q_len: int, k_len: int, mask: Any, spread: float = 1.0
) -> tuple[mx.array, mx.array]:
    queries = mx.random.normal((batch, heads, q_len, 64)) * spread
    keys = mx.random.normal((batch, kv_heads, k_len, 64)) * spread
    values = mx.random.normal((batch, kv_heads, k_len, 64))
    want = REFERENCE_SDPA(queries, keys, values, cache=None, scale=0.125, mask=mask)
    got = fast_sdpa(queries, keys, values, None, 0.125, mask)
    return got, want


@pytest.mark.usefixtures("forms")
@pytest.mark.parametrize(
    ("batch", "heads", "kv_heads", "q_len", "k_len"),
    [
        (1, 4, 4, 9, 9),
        (2, 14, 2, 1, 150),
        (2, 14, 2, 16, 16),
        (3, 8, 2, 5, 70),
        (1, 14, 2, 64, 300),
    ],
)
@pytest.mark.parametrize("mask", [None, "causal"])
def test_sdpa_matches_reference(
    batch: int, heads: int, kv_heads: int, q_len: int, k_len: int, mask: str | None
) -> None:
    got, want = sdpa_pair(batch, heads, kv_heads, q_len, k_len, mask)
    assert_close(got, want, atol=2e-6)


@pytest.mark.usefixtures("forms")
def test_sdpa_causal_with_cached_keys_lets_query_i_see_keys_up_to_offset_plus_i() -> None:
    # L < S: the 4 queries sit at positions 6..9 of 10 keys. Reference and fast form
    # agree, and each differs from attending everything (so the offset mattered).
    got, want = sdpa_pair(1, 4, 2, 4, 10, "causal", spread=2.0)
    everything, _ = sdpa_pair(1, 4, 2, 4, 10, None, spread=2.0)
    assert_close(got, want, atol=2e-6)
    assert not bool(mx.allclose(got[:, :, :-1], everything[:, :, :-1]).item())


@pytest.mark.usefixtures("forms")
@pytest.mark.parametrize(("q_len", "offset"), [(1, 40), (12, 20), (16, 0)])
def test_sdpa_left_padded_bool_masks_match_even_for_fully_masked_rows(
    q_len: int, offset: int
) -> None:
    # With padding 15 on a 16-token prefill, the padded queries see no key at all:
    # the reference attends uniformly there; the fast form must agree and stay finite.
    left = mx.array([0, 3, 15])
    mask = create_causal_mask(q_len, offset=offset, left_padding=left)
    assert mask.dtype == mx.bool_
    got, want = sdpa_pair(3, 14, 2, q_len, offset + q_len, mask)
    assert_close(got, want, atol=2e-6)


@pytest.mark.usefixtures("forms")
def test_sdpa_per_head_bool_mask_and_additive_mask() -> None:
    mask = mx.random.uniform(shape=(2, 6, 5, 9)) > 0.3
    got, want = sdpa_pair(2, 6, 3, 5, 9, mask)
    assert_close(got, want, atol=2e-6)
    additive = mx.random.normal((2, 1, 5, 9)) * 3.0
    got, want = sdpa_pair(2, 6, 3, 5, 9, additive)
    assert_close(got, want, atol=2e-6)


@pytest.mark.usefixtures("forms")
def test_sdpa_with_extreme_scores_stays_finite_and_equal() -> None:
    # Scores in the hundreds are rounded to ~1e-5 of themselves and a weight exp(s - max)
    # moves as much as its score: the two agree to a few ulp of the largest score (~800).
    got, want = sdpa_pair(2, 8, 2, 7, 33, "causal", spread=12.0)
    assert_close(got, want, atol=4e-4)


def recording_kernels(calls: list[str]) -> Any:
    """The loaded kernels, with each call of attention or SwiGLU noted in `calls`."""
    real = kernels.load_kernels().module
    assert real is not None

    def note(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return getattr(real, name)(*args, **kwargs)

        return call

    return SimpleNamespace(attention=note("attention"), swiglu=note("swiglu"))


def test_the_forms_use_the_kernels_when_loaded_and_fall_back_without(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    status = kernels.KernelsStatus(recording_kernels(calls), "avx512", "recording")
    monkeypatch.setattr(kernels, "_status", status)
    gate, up = mx.random.normal((2, 50)), mx.random.normal((2, 50))
    mask = create_causal_mask(5, offset=20, left_padding=mx.array([0, 4]))
    for kernel in (True, False):  # loaded, then unavailable
        got, want = sdpa_pair(2, 14, 2, 5, 25, mask)
        assert_close(got, want, atol=2e-6)
        got, want = sdpa_pair(1, 4, 2, 3, 70, "causal")
        assert_close(got, want, atol=2e-6)
        assert_close(fast_swiglu(gate, up), REFERENCE_SWIGLU(gate, up), atol=1e-6)
        assert calls == (["attention", "attention", "swiglu"] if kernel else [])
        calls.clear()
        monkeypatch.setattr(kernels, "_status", kernels.KernelsStatus(None, None, "off"))
    monkeypatch.setattr(kernels, "_status", status)
    with composed_forms():
        sdpa_pair(1, 4, 2, 3, 7, None)
        fast_swiglu(gate, up)
    assert calls == []


@pytest.mark.usefixtures("forms")
def test_sdpa_hands_what_it_does_not_cover_to_the_reference() -> None:
    queries = mx.random.normal((1, 4, 3, 32)).astype(mx.float16)
    keys = mx.random.normal((1, 2, 3, 32)).astype(mx.float16)
    values = mx.random.normal((1, 2, 3, 32)).astype(mx.float16)
    got = fast_sdpa(queries, keys, values, None, 0.2, "causal")
    want = REFERENCE_SDPA(queries, keys, values, cache=None, scale=0.2, mask="causal")
    assert bool(mx.array_equal(got, want).item())
    sinks = mx.zeros((4,))
    q32, k32, v32 = (a.astype(mx.float32) for a in (queries, keys, values))
    got = fast_sdpa(q32, k32, v32, None, 0.2, "causal", sinks=sinks)
    want = REFERENCE_SDPA(q32, k32, v32, cache=None, scale=0.2, mask="causal", sinks=sinks)
    assert bool(mx.array_equal(got, want).item())


@pytest.mark.parametrize("shape", [(1, 151936), (8, 1000), (3, 4, 50)])
def test_log_softmax_matches_logsumexp_form(shape: tuple[int, ...]) -> None:
    logits = mx.random.normal(shape) * 12.0 + 40.0
    want = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    assert_close(fast_log_softmax(logits), want, atol=1e-5, rtol=1e-6)
    want0 = logits - mx.logsumexp(logits, axis=0, keepdims=True)
    assert_close(fast_log_softmax(logits, axis=0), want0, atol=1e-5, rtol=1e-6)


def test_log_softmax_keeps_masked_tokens_at_minus_infinity() -> None:
    logits = mx.random.normal((2, 100)) * 5.0
    logits = mx.where(mx.arange(100) % 3 == 0, -mx.inf, logits)
    want = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    got = fast_log_softmax(logits)
    assert bool(mx.array_equal(mx.isinf(got), mx.isinf(want)).item())
    finite = mx.isfinite(want)
    assert_close(mx.where(finite, got, 0.0), mx.where(finite, want, 0.0), atol=1e-5)


# --- on models ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    from mlx_lm.utils import load

    model, tokenizer = load(str(ensure_tiny_model()))[:2]
    return model, tokenizer


def test_install_rebinds_the_model_module_and_can_be_undone(tiny: tuple[Any, Any]) -> None:
    model, _ = tiny
    assert bound("swiglu") is REFERENCE_SWIGLU
    assert install_cpu_forms(model)
    assert bound("swiglu") is fast_swiglu
    assert bound("scaled_dot_product_attention") is fast_sdpa
    with reference_forms():
        assert bound("swiglu") is REFERENCE_SWIGLU
        assert bound("scaled_dot_product_attention") is REFERENCE_SDPA
    assert bound("swiglu") is fast_swiglu
    uninstall_cpu_forms()
    assert bound("swiglu") is REFERENCE_SWIGLU
    assert bound("scaled_dot_product_attention") is REFERENCE_SDPA
    assert cpu_forms.REFERENCE_SDPA is REFERENCE_SDPA  # the base module is left alone


def test_install_is_refused_off_the_cpu(
    tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cpu_forms.on_cpu()  # this machine's MLX has no GPU backend
    monkeypatch.setattr(cpu_forms, "on_cpu", lambda: False)
    assert not install_cpu_forms(tiny[0])
    assert bound("swiglu") is REFERENCE_SWIGLU


def greedy_batch(model: Any, tokenizer: Any, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Greedy tokens of a batch whose prompts differ in length (so it is left-padded)."""
    from mlx_lm.generate import batch_generate

    result = batch_generate(
        model, tokenizer, prompts, max_tokens=n, return_token_ids=True, prefill_step_size=8
    )
    assert result.token_ids is not None
    return [list(ids) for ids in result.token_ids]


def greedy_single(model: Any, prompt: list[int], n: int) -> list[int]:
    from mlx_lm.generate import generate_step

    steps = generate_step(mx.array(prompt), model, max_tokens=n, prefill_step_size=8)
    return [int(token) for token, _ in steps]


def prompts_for(tokenizer: Any) -> list[list[int]]:
    texts = ["Write a Python function that reverses a string.", "Hi", "List three prime numbers."]
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": t}], add_generation_prompt=True
            )
        )
        for t in texts
    ]


def greedy_padded_loop(model: Any, prompts: list[list[int]], n: int) -> list[list[int]]:
    """A plain greedy loop over a left-padded batch (bool masks in every layer)."""
    from mlx_lm.models.cache import BatchKVCache

    width = max(len(p) for p in prompts)
    padding = [width - len(p) for p in prompts]
    tokens = mx.array([[0] * pad + p for pad, p in zip(padding, prompts, strict=True)])
    caches = [BatchKVCache(padding) for _ in model.layers]
    out: list[list[int]] = [[] for _ in prompts]
    for _ in range(n):
        logits = model(tokens, cache=caches)[:, -1, :]
        tokens = mx.argmax(logits, axis=-1)[:, None]
        for row, token in zip(out, cast(list[int], tokens[:, 0].tolist()), strict=True):
            row.append(int(token))
    return out


def library_runs(model: Any, tokenizer: Any, prompts: list[list[int]], n: int) -> Any:
    """mlx-lm's own single and batched generation loops."""
    return greedy_single(model, prompts[0], n), greedy_batch(model, tokenizer, prompts, n)


def compare_greedy(model: Any, tokenizer: Any, n: int, *, library: bool) -> None:
    prompts = prompts_for(tokenizer)
    assert install_cpu_forms(model)
    fast_batch = greedy_padded_loop(model, prompts[1:], n)
    fast_lib = library_runs(model, tokenizer, prompts, n) if library else None
    with reference_forms():
        assert bound("swiglu") is REFERENCE_SWIGLU
        ref_batch = greedy_padded_loop(model, prompts[1:], n)
        ref_lib = library_runs(model, tokenizer, prompts, n) if library else None
    assert len(ref_batch[0]) == n
    assert fast_batch == ref_batch
    assert fast_lib == ref_lib


def test_greedy_tokens_are_identical_on_the_tiny_model(tiny: tuple[Any, Any]) -> None:
    compare_greedy(*tiny, n=40, library=True)


def test_greedy_tokens_are_identical_on_the_default_model() -> None:
    from mlx_lm.utils import load

    path = default_model_dir()
    assert is_ready(path), "the default model is missing: run `mlxcel fetch-model` first"
    model, tokenizer = load(str(Path(path)))[:2]
    compare_greedy(model, tokenizer, n=24, library=False)


def long_prompt(tokenizer: Any, functions: int) -> list[int]:
    """A code-review request over `functions` small functions (~25 tokens each)."""
    code = "\n".join(
        f"def f{i}(x):\n    return x * {i} + {i * i % 97} if x > {i % 13} else None"
        for i in range(functions)
    )
    message = f"Review this code and list its bugs:\n{code}"
    chat = [{"role": "user", "content": message}]
    return list(tokenizer.apply_chat_template(chat, add_generation_prompt=True))


def first_difference(ours: list[int], theirs: list[int]) -> int | None:
    return next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), None)


def test_greedy_tokens_after_a_long_prompt_are_identical_with_the_kernels() -> None:
    """64 greedy tokens after a ~2,000-token prompt on the default model, through the
    compiled attention and SwiGLU and through mlx-lm's own ops: read in 512-token chunks
    (causal masks), and as a left-padded batch of two (boolean masks)."""
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load

    from mlxcel.model.native.qmm import install_quantized_forms

    path = default_model_dir()
    assert is_ready(path), "the default model is missing: run `mlxcel fetch-model` first"
    model, tokenizer = load(str(Path(path)))[:2]
    prompt, shorter = long_prompt(tokenizer, 80), long_prompt(tokenizer, 60)
    assert 1900 <= len(prompt) <= 2200
    assert len(shorter) < len(prompt)
    assert install_quantized_forms(model) > 0  # as the engine: the products on the CPU kernel
    assert install_cpu_forms(model)
    assert kernels.load_kernels().available
    runs = []
    kinds: tuple[AbstractContextManager[None], ...] = (nullcontext(), reference_forms())
    for forms in kinds:
        with forms:
            steps = generate_step(mx.array(prompt), model, max_tokens=64, prefill_step_size=512)
            single = [int(token) for token, _ in steps]
            batch = greedy_padded_loop(model, [prompt, shorter], 64)
        runs.append([single, *batch])
    for ours, theirs in zip(*runs, strict=True):
        first = first_difference(ours, theirs)
        assert first is None, f"first differ at token {first}: {ours[first:]} / {theirs[first:]}"
