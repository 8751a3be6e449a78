"""The MLX engine on a tiny random-weight model: batching, chunked prefill, removal.

The tiny model has the default model's real tokenizer and chat template, so this runs
the same code path as the real engine in seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mlxcel.generation import Sampling, SequenceSpec, TokenStep
from mlxcel.model.engine import LoadedModel
from mlxcel.model.native.blas import load_fast_blas

from tiny_model import ensure_tiny_model, load_tiny

pytestmark = pytest.mark.mlx


@pytest.fixture(scope="module")
def tiny_path() -> Path:
    load_fast_blas()
    return ensure_tiny_model()


def load(path: Path, *, max_batch: int = 4, prefill_step_size: int = 16) -> LoadedModel:
    loaded: LoadedModel = load_tiny(path, max_batch=max_batch, prefill_step_size=prefill_step_size)
    return loaded


def prompt(loaded: LoadedModel, text: str) -> tuple[int, ...]:
    return tuple(loaded.codec.render([{"role": "user", "content": text}], None))


def run_to_end(loaded: LoadedModel, limit: int = 500) -> dict[int, list[TokenStep]]:
    out: dict[int, list[TokenStep]] = {}
    for _ in range(limit):
        if not loaded.engine.has_work():
            return out
        for step in loaded.engine.step():
            out.setdefault(step.seq_id, []).append(step)
    raise AssertionError("engine did not finish")


def test_batched_sequences_finish_with_their_own_limits(tiny_path: Path) -> None:
    loaded = load(tiny_path)
    for seq_id, n in ((1, 3), (2, 7), (3, 5)):
        loaded.engine.insert(
            SequenceSpec(
                seq_id, prompt(loaded, f"hello {seq_id}"), Sampling(temperature=0.7, max_tokens=n)
            )
        )
    out = run_to_end(loaded)
    for seq_id, n in ((1, 3), (2, 7), (3, 5)):
        steps = out[seq_id]
        assert steps[-1].finish in ("stop", "length")
        assert all(s.finish is None for s in steps[:-1])
        assert len(steps) <= n
        if steps[-1].finish == "length":
            assert len(steps) == n
    loaded.engine.close()


def test_greedy_output_is_deterministic_and_decodes_to_text(tiny_path: Path) -> None:
    loaded = load(tiny_path)
    texts = []
    for seq_id in (1, 2):
        loaded.engine.insert(
            SequenceSpec(
                seq_id, prompt(loaded, "same prompt"), Sampling(temperature=0.0, max_tokens=8)
            )
        )
        out = run_to_end(loaded)
        texts.append(("".join(s.text for s in out[seq_id]), [s.token for s in out[seq_id]]))
    assert texts[0] == texts[1]
    loaded.engine.close()


def test_removed_sequence_stops_and_others_continue(tiny_path: Path) -> None:
    loaded = load(tiny_path)
    engine = loaded.engine
    engine.insert(SequenceSpec(1, prompt(loaded, "a"), Sampling(temperature=0, max_tokens=50)))
    engine.insert(SequenceSpec(2, prompt(loaded, "b"), Sampling(temperature=0, max_tokens=6)))
    seen: dict[int, int] = {1: 0, 2: 0}
    while seen[1] < 2:
        for step in engine.step():
            seen[step.seq_id] += 1
    engine.remove(1)
    out = run_to_end(loaded)
    assert 1 not in out
    assert seen[2] + len(out.get(2, [])) <= 6
    assert not engine.has_work()
    engine.close()


def test_long_prompt_prefill_is_chunked_between_decode_steps(tiny_path: Path) -> None:
    loaded = load(tiny_path, prefill_step_size=16)
    engine = loaded.engine
    engine.insert(SequenceSpec(1, prompt(loaded, "short"), Sampling(temperature=0, max_tokens=200)))
    while not any(s.seq_id == 1 for s in engine.step()):
        pass  # sequence 1 is decoding
    long_prompt = prompt(loaded, " ".join(["word"] * 300))
    assert len(long_prompt) > 10 * 16
    engine.insert(SequenceSpec(2, long_prompt, Sampling(temperature=0, max_tokens=4)))
    steps_until_second = 0
    decoded_meanwhile = 0
    while True:
        steps = engine.step()
        steps_until_second += 1
        if any(s.seq_id == 2 for s in steps):
            break
        decoded_meanwhile += sum(1 for s in steps if s.seq_id == 1)
    # The long prompt took many chunks, and sequence 1 got a token in every one of them.
    assert steps_until_second >= len(long_prompt) // 16
    assert decoded_meanwhile >= steps_until_second - 2
    engine.close()


def test_codec_renders_the_real_chat_template(tiny_path: Path) -> None:
    loaded = load(tiny_path)
    tokens = loaded.codec.render(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], None
    )
    from mlx_lm import load as mlx_load

    _, tokenizer = mlx_load(str(tiny_path))[:2]
    text = tokenizer.decode(tokens)
    assert text.startswith("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>")
    assert text.endswith("<|im_start|>assistant\n")
    loaded.engine.close()


def test_no_prefill_chunk_exceeds_the_step_budget(
    tiny_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlxcel.model import flat_forward, mlx_engine

    loaded = load(tiny_path, max_batch=8, prefill_step_size=48)
    engine: Any = loaded.engine
    chunks: list[tuple[int, int]] = []  # (tokens computed, padding included; the budget)
    shared: list[int] = []  # prompt tokens read in a decode step's forward
    plan, step_logits = mlx_engine.plan_chunk, flat_forward.step_logits

    def plan_spy(waiting: Any, budget: int) -> Any:
        chunk = plan(waiting, budget)
        if chunk is not None:
            chunks.append((chunk.tokens, budget))
        return chunk

    def step_spy(model: Any, groups: Any, fused: Any = None) -> Any:
        shared.append(sum(len(g.tokens) * len(g.tokens[0]) for g in groups[1:]))
        return step_logits(model, groups, fused)

    monkeypatch.setattr(mlx_engine, "plan_chunk", plan_spy)
    monkeypatch.setattr(flat_forward, "step_logits", step_spy)
    texts = ["a", " ".join(["long"] * 120), "b c", " ".join(["mid"] * 30), "d", "e f g"]
    for seq_id, text in enumerate(texts):
        engine.insert(SequenceSpec(seq_id, prompt(loaded, text), Sampling(0, max_tokens=6)))
    out = run_to_end(loaded)
    assert set(out) == set(range(len(texts)))
    assert len(chunks) > 5
    assert all(tokens <= budget <= 48 for tokens, budget in chunks)
    assert any(tokens > 16 for tokens, _ in chunks)  # prompts shared chunks
    assert engine.flat
    assert shared  # prompts were read beside decoding rows
    assert all(n > 0 for n in shared)
    engine.close()


def test_the_first_token_comes_from_the_step_that_reads_the_prompts_end(tiny_path: Path) -> None:
    loaded = load(tiny_path, prefill_step_size=16)
    engine: Any = loaded.engine
    prompts = {1: prompt(loaded, "short"), 2: prompt(loaded, " ".join(["word"] * 60))}
    engine.insert(SequenceSpec(1, prompts[1], Sampling(0, max_tokens=100)))
    engine.insert(SequenceSpec(2, prompts[2], Sampling(0, max_tokens=3)))
    assert len(prompts[2]) > 3 * 16
    first: set[int] = set()
    for _ in range(200):
        before = {p.seq_id: p.total - p.read for p in engine.prefilling()}
        for step in engine.decode():
            assert step.seq_id in first  # decode only serves sequences past their prompt
        for step in engine.prefill():
            assert step.seq_id not in first
            first.add(step.seq_id)
            left = before.get(step.seq_id, len(prompts[step.seq_id]))
            assert left <= 16  # this very chunk read the prompt's last tokens
        if 2 in first:
            break
    assert first == {1, 2}
    assert all(p.seq_id != 2 for p in engine.prefilling())
    engine.close()


def test_a_prompt_removed_between_its_last_chunk_and_its_first_token_is_dropped(
    tiny_path: Path,
) -> None:
    loaded = load(tiny_path, prefill_step_size=64)
    engine: Any = loaded.engine
    engine.insert(SequenceSpec(1, prompt(loaded, "short"), Sampling(0, max_tokens=50)))
    while not engine._running:
        engine.step()
    engine.insert(SequenceSpec(2, prompt(loaded, "another one"), Sampling(0, max_tokens=5)))
    engine.decode()  # the decode forward reads sequence 2's whole prompt ...
    assert engine._read is not None
    assert engine._read.ended == (2,)
    engine.remove(2)  # ... and its client leaves before the first token is sampled
    assert engine.prefill() == []
    after = run_to_end(loaded)
    assert set(after) == {1}
    assert after[1][-1].finish == "length"
    engine.close()


def test_a_long_prompt_joining_short_rows_decodes_as_it_would_alone(tiny_path: Path) -> None:
    """The long row decodes in a KV state of its own beside the short rows'
    (`decode_batch`); everyone's greedy tokens are those of running alone."""
    loaded = load(tiny_path, max_batch=4, prefill_step_size=64)
    engine: Any = loaded.engine
    short = {i: prompt(loaded, f"short question {i}") for i in (1, 2, 3)}
    long_prompt = prompt(loaded, " ".join(f"line {k} of a long document" for k in range(90)))
    assert len(long_prompt) > 1.5 * max(len(p) for p in short.values()) + 256
    alone: dict[int, list[int]] = {}
    for seq_id, p in [*short.items(), (4, long_prompt)]:
        engine.insert(SequenceSpec(seq_id, p, Sampling(temperature=0, max_tokens=24)))
        alone[seq_id] = [s.token for s in run_to_end(loaded)[seq_id]]
    for seq_id, p in short.items():
        engine.insert(SequenceSpec(10 + seq_id, p, Sampling(temperature=0, max_tokens=24)))
    together: dict[int, list[int]] = {}
    groups_seen = 0
    for _ in range(500):
        if not engine.has_work():
            break
        for step in engine.step():
            together.setdefault(step.seq_id, []).append(step.token)
        if len(together.get(11, [])) == 2:
            engine.insert(SequenceSpec(14, long_prompt, Sampling(temperature=0, max_tokens=24)))
        groups_seen = max(groups_seen, len(engine._running.groups()))
    assert groups_seen == 2
    assert {k - 10: v for k, v in together.items()} == alone
    engine.close()
