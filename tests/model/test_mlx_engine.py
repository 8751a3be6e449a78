"""The MLX engine on a tiny random-weight model: batching, chunked prefill, removal.

The tiny model has the default model's real tokenizer and chat template, so this runs
the same code path as the real engine in seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxcel.config import Settings
from mlxcel.generation import Sampling, SequenceSpec, TokenStep
from mlxcel.model.engine import LoadedModel
from mlxcel.model.provision.blas import load_fast_blas

from tiny_model import ensure_tiny_model

pytestmark = pytest.mark.mlx


@pytest.fixture(scope="module")
def tiny_path() -> Path:
    load_fast_blas()
    return ensure_tiny_model()


def load(path: Path, *, max_batch: int = 4, prefill_step_size: int = 16) -> LoadedModel:
    from mlxcel.model.mlx_engine import load_mlx_model

    return load_mlx_model(
        path,
        name="tiny",
        max_batch=max_batch,
        prefill_step_size=prefill_step_size,
        blas=load_fast_blas(),
        prompt_cache_bytes=Settings().prompt_cache_bytes,
    )


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
