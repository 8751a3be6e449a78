"""The prompt (prefix) cache on the tiny random-weight model: reuse, exactness, bounds.

Every reuse is checked against the same requests on an engine without the cache:
greedy tokens must match exactly and their log-probabilities closely, so a KV state
reused at the wrong position or for the wrong tokens shows up.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema
import pytest

from mlxcel.generation import Sampling, SequenceSpec, TokenStep
from mlxcel.model.engine import LoadedModel
from mlxcel.model.native.blas import load_fast_blas

from tiny_model import ensure_tiny_model

pytestmark = pytest.mark.mlx

STEP = 16  # prefill_step_size of the engines here


def load(cache_bytes: int) -> LoadedModel:
    load_fast_blas()
    from mlxcel.model.mlx_load import load_mlx_model

    return load_mlx_model(
        ensure_tiny_model(),
        name="tiny",
        max_batch=4,
        prefill_step_size=STEP,
        blas=load_fast_blas(),
        prompt_cache_bytes=cache_bytes,
    )


@pytest.fixture(scope="module")
def cold() -> LoadedModel:
    """An engine without the cache: the reference every reuse is compared with."""
    return load(0)


@pytest.fixture(scope="module")
def shared_warm() -> LoadedModel:
    return load(1 << 26)


@pytest.fixture
def warm(shared_warm: LoadedModel) -> LoadedModel:
    """The engine with the cache, emptied (64 MiB)."""
    return with_cache(shared_warm, 1 << 26)


def with_cache(loaded: LoadedModel, cache_bytes: int) -> LoadedModel:
    from mlxcel.model.cache.prefix import PrefixCache

    assert not loaded.engine.has_work()
    loaded.engine.prefix_cache = PrefixCache(cache_bytes)  # type: ignore[attr-defined]
    return loaded


def render(loaded: LoadedModel, *messages: tuple[str, str]) -> list[int]:
    return loaded.codec.render([{"role": r, "content": c} for r, c in messages], None)


def greedy(max_tokens: int = 12, **kwargs: Any) -> Sampling:
    return Sampling(temperature=0.0, max_tokens=max_tokens, logprobs=True, **kwargs)


@dataclass
class Run:
    steps: list[TokenStep]

    @property
    def tokens(self) -> list[int]:
        return [s.token for s in self.steps]

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.steps)

    @property
    def cached(self) -> int:
        return self.steps[0].cached_tokens

    def logprobs(self) -> list[float]:
        return [s.logprob.logprob for s in self.steps if s.logprob is not None]


def run(loaded: LoadedModel, *specs: SequenceSpec, limit: int = 2000) -> dict[int, Run]:
    for spec in specs:
        loaded.engine.insert(spec)
    out: dict[int, Run] = {}
    for _ in range(limit):
        if not loaded.engine.has_work():
            return out
        for step in loaded.engine.step():
            out.setdefault(step.seq_id, Run([])).steps.append(step)
    raise AssertionError("engine did not finish")


def one(loaded: LoadedModel, seq_id: int, prompt: list[int], sampling: Sampling) -> Run:
    return run(loaded, SequenceSpec(seq_id, tuple(prompt), sampling))[seq_id]


def assert_same(cached: Run, fresh: Run) -> None:
    assert cached.tokens == fresh.tokens
    assert cached.text == fresh.text
    assert cached.logprobs() == pytest.approx(fresh.logprobs(), abs=1e-3)
    assert [s.finish for s in cached.steps] == [s.finish for s in fresh.steps]


def prefix_cache(loaded: LoadedModel) -> Any:
    cache = loaded.engine.prefix_cache  # type: ignore[attr-defined]
    assert cache is not None
    return cache


def test_follow_up_turn_reuses_history_and_generates_the_same(
    warm: LoadedModel, cold: LoadedModel
) -> None:
    first_turn = ("user", "Tell me about the sea. " * 6)
    turns = {}
    for name, loaded in (("warm", warm), ("cold", cold)):
        first = one(loaded, 1, render(loaded, first_turn), greedy())
        loaded.engine.idle()  # MLX's buffer cache is emptied; the prefix cache's stay
        history = render(loaded, first_turn, ("assistant", first.text), ("user", "And rivers?"))
        turns[name] = (first, history, one(loaded, 2, history, greedy(20)))
    (first, history, second), (cold_first, cold_history, cold_second) = turns["warm"], turns["cold"]
    assert history == cold_history
    assert first.cached == 0
    assert_same(first, cold_first)
    # The second prompt starts with the first prompt and its reply: all that was reused.
    prompt_len = len(render(warm, first_turn))
    assert second.cached >= prompt_len
    assert second.cached < len(history)
    assert all(s.cached_tokens == 0 for s in second.steps[1:])
    assert_same(second, cold_second)
    assert cold_second.cached == 0
    # What was read afresh was written to the cache; with no cache nothing was.
    assert first.steps[0].cache_write_tokens == prompt_len
    assert second.steps[0].cache_write_tokens == len(history) - second.cached
    assert all(s.cache_write_tokens == 0 for s in second.steps[1:])
    assert cold_second.steps[0].cache_write_tokens == 0


def test_a_repeated_prompt_prefills_only_its_last_token(
    warm: LoadedModel, cold: LoadedModel
) -> None:
    prompt = render(warm, ("user", "repeat after me " * 5))
    first = one(warm, 1, prompt, greedy())
    # One entry: the prompt's, kept when it was read, gave way to the finished one.
    assert len(prefix_cache(warm)) == 1
    # The first sequence's prompt and reply, exactly as cached when it finished.
    exact = prompt + first.tokens
    again = one(warm, 2, exact, greedy())
    assert again.cached == len(exact) - 1
    assert_same(again, one(cold, 2, exact, greedy()))
    # The bare prompt is a prefix of that entry: reused up to its last token too.
    same = one(warm, 3, prompt, greedy())
    assert same.cached == len(prompt) - 1
    assert_same(same, first)


def test_a_disabled_cache_reports_nothing_cached(cold: LoadedModel) -> None:
    loaded = cold  # loaded with prompt_cache_bytes=0
    assert loaded.engine.prefix_cache is None  # type: ignore[attr-defined]
    prompt = render(loaded, ("user", "twice"))
    assert one(loaded, 1, prompt, greedy()).cached == 0
    assert one(loaded, 2, prompt, greedy()).cached == 0


def test_the_cache_stays_within_its_byte_budget(warm: LoadedModel, cold: LoadedModel) -> None:
    limit = 96 * 1024  # the tiny model's KV state is 512 bytes a token
    loaded = with_cache(warm, limit)
    cache = prefix_cache(loaded)
    entries = []
    for i in range(12):
        prompt = render(loaded, ("user", f"prompt number {i}: " + "filler words " * 12))
        one(loaded, i, prompt, greedy(8))
        assert 0 < cache.nbytes <= limit
        entries.append(len(cache))
    assert max(entries) < 12  # older entries were evicted
    # The newest one is still there and still right.
    last = render(loaded, ("user", "prompt number 11: " + "filler words " * 12))
    reused = one(loaded, 99, last, greedy(8))
    assert reused.cached == len(last) - 1
    assert_same(reused, one(cold, 99, last, greedy(8)))


def test_an_entry_larger_than_the_budget_is_not_kept(warm: LoadedModel) -> None:
    loaded = with_cache(warm, 4 * 1024)
    prompt = render(loaded, ("user", "far too long for the cache " * 10))
    one(loaded, 1, prompt, greedy(4))
    assert prefix_cache(loaded).nbytes == 0
    assert one(loaded, 2, prompt, greedy(4)).cached == 0


def test_removing_a_sequence_mid_prefill_keeps_what_it_read(
    warm: LoadedModel, cold: LoadedModel
) -> None:
    prompt = render(warm, ("user", " ".join(f"w{i}" for i in range(120))))
    assert len(prompt) > 10 * STEP
    warm.engine.insert(SequenceSpec(1, tuple(prompt), greedy()))
    for _ in range(4):
        assert warm.engine.step() == []  # still reading the prompt
    warm.engine.remove(1)
    assert not warm.engine.has_work()
    expected = one(cold, 1, prompt, greedy())
    for seq_id in (2, 3):  # reused the partial prompt, then the whole one
        again = one(warm, seq_id, prompt, greedy())
        assert 0 < again.cached < len(prompt)
        assert_same(again, expected)
    assert again.cached == len(prompt) - 1


def test_removing_a_sequence_mid_generation_keeps_its_tokens(
    warm: LoadedModel, cold: LoadedModel
) -> None:
    prompt = render(warm, ("user", "stop me early " * 4))
    warm.engine.insert(SequenceSpec(1, tuple(prompt), greedy(50)))
    got: list[int] = []
    while len(got) < 3:
        got += [s.token for s in warm.engine.step()]
    warm.engine.remove(1)
    extended = prompt + got + render(warm, ("user", "next"))
    again = one(warm, 2, extended, greedy())
    # The KV state holds every reported token but the last, which no step has fed yet.
    assert again.cached == len(prompt) + len(got) - 1
    assert_same(again, one(cold, 2, extended, greedy()))


def test_cached_and_fresh_sequences_batched_together(warm: LoadedModel, cold: LoadedModel) -> None:
    shared = ("system", "You are a careful assistant. " * 8)
    prompts = [render(warm, shared, ("user", f"question {i}")) for i in range(3)]
    other = render(warm, ("user", "unrelated"))
    one(warm, 1, prompts[0], greedy(4))  # warms the shared instructions
    specs = [SequenceSpec(10 + i, tuple(p), greedy()) for i, p in enumerate([*prompts, other])]
    batched, fresh = run(warm, *specs), run(cold, *specs)
    assert batched[10].cached == len(prompts[0]) - 1
    assert batched[11].cached > len(render(warm, shared)) - 5  # the instructions, at least
    assert batched[13].cached < 8  # only the template's opening tokens are shared
    for seq_id in batched:
        assert_same(batched[seq_id], fresh[seq_id])


def test_grammar_constrained_output_on_a_cached_prompt(
    warm: LoadedModel, cold: LoadedModel
) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    grammar = warm.codec.compile_schema(schema)
    prompt = render(warm, ("user", "answer in JSON " * 5))
    one(warm, 1, prompt, greedy(6))  # no grammar: caches the prompt
    sampling = greedy(60, grammar=grammar)
    constrained = one(warm, 2, prompt, sampling)
    assert constrained.cached == len(prompt) - 1
    assert constrained.steps[-1].finish == "stop"
    jsonschema.validate(json.loads(constrained.text), schema)
    assert_same(constrained, one(cold, 2, prompt, sampling))


def test_a_failed_step_keeps_nothing_from_the_broken_batch(
    warm: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlxcel.model import forward

    loaded = warm
    engine: Any = loaded.engine
    prompt = render(loaded, ("user", " ".join(f"x{i}" for i in range(80))))
    engine.insert(SequenceSpec(1, tuple(prompt), greedy()))
    engine.step()

    def broken(*_: Any) -> Any:
        raise RuntimeError("boom")

    with monkeypatch.context() as patch:
        patch.setattr(forward, "read_chunk", broken)
        with pytest.raises(RuntimeError):
            engine.step()
    engine.remove(1)  # what the model actor does after a failed step
    assert len(prefix_cache(loaded)) == 0
    assert one(loaded, 2, prompt, greedy(4)).cached == 0
    assert len(prefix_cache(loaded)) > 0  # healthy again once the engine emptied


def test_a_prompt_read_is_kept_when_its_sequence_ends_at_the_first_token(
    warm: LoadedModel,
) -> None:
    prompt = render(warm, ("user", "one token only, please " * 4))
    first = one(warm, 1, prompt, greedy(1))
    assert first.cached == 0
    assert first.steps[0].cache_write_tokens == len(prompt)
    # Nothing was decoded: only the prompt's KV state, kept when it was read, can serve this.
    assert one(warm, 2, prompt, greedy(1)).cached == len(prompt) - 1


def test_a_tenant_is_served_only_its_own_entries(warm: LoadedModel) -> None:
    prompt = tuple(render(warm, ("user", "a prompt two tenants both send " * 6)))
    first = run(warm, SequenceSpec(1, prompt, greedy(), "key-a"))[1]
    other = run(warm, SequenceSpec(2, prompt, greedy(), "key-b"))[2]
    again = run(warm, SequenceSpec(3, prompt, greedy(), "key-a"))[3]
    assert first.cached == 0
    assert other.cached == 0  # the same prompt, another tenant: nothing reused
    assert again.cached == len(prompt) - 1
    assert_same(other, first)
    assert_same(again, first)
    # Two new tenants read one prompt side by side: neither is served the other's.
    fresh = tuple(render(warm, ("user", "another prompt, sent at once " * 6)))
    both = run(warm, SequenceSpec(4, fresh, greedy(), "key-c"), SequenceSpec(5, fresh, greedy()))
    assert both[4].cached == both[5].cached == 0
    assert_same(both[4], both[5])
