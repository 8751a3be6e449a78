"""The fake engine's gate: a test holds sequences in flight after their first word and
releases them, without real-time delays."""

from __future__ import annotations

import threading
import time

from mlxcel.generation import Sampling, SequenceSpec
from mlxcel.model.fake import HELD_STEP_SECS, FakeCodec, FakeEngine


def spec(seq_id: int, text: str) -> SequenceSpec:
    prompt = FakeCodec().render([{"role": "user", "content": text}], None)
    return SequenceSpec(seq_id, tuple(prompt), Sampling(max_tokens=100))


def words(engine: FakeEngine) -> dict[int, str]:
    return {step.seq_id: step.text for step in engine.step()}


def test_a_held_sequence_stops_after_its_first_word_until_released() -> None:
    engine = FakeEngine()
    engine.hold()
    engine.insert(spec(1, "echo: a b c"))
    assert words(engine) == {1: "a"}  # the prefill phase's word
    for _ in range(3):
        assert words(engine) == {}
    assert (engine.held, engine.active) == (3, 1)
    engine.release()
    assert words(engine) == {1: " b"}
    assert words(engine) == {1: " c"}
    assert engine.active == 0
    assert engine.held == 3


def test_holding_on_a_word_holds_only_the_replies_that_have_it() -> None:
    engine = FakeEngine()
    engine.hold(on="w0")
    engine.insert(spec(1, "echo: w0 w1"))
    engine.insert(spec(2, "echo: s t"))
    assert words(engine) == {1: "w0", 2: "s"}
    assert words(engine) == {2: " t"}
    assert words(engine) == {}
    engine.release()
    assert words(engine) == {1: " w1"}


def test_a_held_step_returns_at_once_and_a_release_from_another_thread_lets_it_on() -> None:
    engine = FakeEngine()
    engine.hold()
    engine.insert(spec(1, "echo: a b"))
    engine.step()
    started = time.monotonic()
    assert engine.decode() == []  # the model thread is never stuck on the gate
    assert time.monotonic() - started < HELD_STEP_SECS + 1
    releaser = threading.Thread(target=engine.release)
    releaser.start()
    releaser.join()
    assert [s.text for s in engine.decode()] == [" b"]
