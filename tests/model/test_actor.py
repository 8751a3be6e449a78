"""The model actor: its thread, sequences, aborts and engine failures (fake engine)."""

from __future__ import annotations

import functools
import threading

import trio

from mlxcel.generation import Sampling, SequenceFailed, TokenStep
from mlxcel.model.actor import ModelActor, ModelHandle
from mlxcel.model.fake import FakeCodec, FakeEngine, fake_factory

from support import LONG, wait_until


def prompt(text: str) -> list[int]:
    return FakeCodec().render([{"role": "user", "content": text}], None)


async def start(nursery: trio.Nursery, engine: FakeEngine) -> ModelHandle:
    handle: ModelHandle = await nursery.start(
        ModelActor(functools.partial(fake_factory, engine), 4).run
    )
    with trio.fail_after(5):
        await handle.ready.wait()
    return handle


async def test_starts_generates_and_stops_cleanly() -> None:
    engine = FakeEngine()
    async with trio.open_nursery() as nursery:
        model = await start(nursery, engine)
        async with model.open_sequence(prompt("echo: a b c"), Sampling(max_tokens=10)) as seq:
            steps = [step async for step in seq]
        assert all(isinstance(s, TokenStep) for s in steps)
        assert "".join(s.text for s in steps if isinstance(s, TokenStep)) == "a b c"
        assert steps[-1].finish == "stop"  # type: ignore[union-attr]
        nursery.cancel_scope.cancel()
    assert engine.closed


async def test_sequences_decode_together(nursery: trio.Nursery) -> None:
    engine = FakeEngine(step_delay=0.001)
    model = await start(nursery, engine)
    results: dict[str, str] = {}

    async def run(word: str) -> None:
        async with model.open_sequence(prompt(f"echo: {word} {word}"), Sampling()) as seq:
            results[word] = "".join([s.text async for s in seq if isinstance(s, TokenStep)])

    async with trio.open_nursery() as inner:
        for word in ("x", "y", "z"):
            inner.start_soon(run, word)
    assert results == {"x": "x x", "y": "y y", "z": "z z"}
    assert engine.steps <= 4  # three sequences of two words share the steps


async def test_leaving_a_sequence_aborts_it(nursery: trio.Nursery) -> None:
    engine = FakeEngine()
    engine.hold()  # the sequence runs until it is left
    model = await start(nursery, engine)
    async with model.open_sequence(prompt(LONG), Sampling(max_tokens=1000)) as seq:
        await seq.receive()
    with trio.fail_after(5):  # held, it could leave the engine no other way than aborted
        await wait_until(lambda: engine.active == 0)


async def test_engine_failure_fails_sequences_and_the_actor_lives_on(
    nursery: trio.Nursery,
) -> None:
    model = await start(nursery, FakeEngine(fail_on="boom"))
    async with model.open_sequence(prompt("echo: ok boom"), Sampling()) as seq:
        events = [e async for e in seq]
    assert isinstance(events[-1], SequenceFailed)
    assert "boom" in events[-1].message
    async with model.open_sequence(prompt("echo: still here"), Sampling()) as seq:
        text = "".join([e.text async for e in seq if isinstance(e, TokenStep)])
    assert text == "still here"


async def test_length_limit_finishes_with_length(nursery: trio.Nursery) -> None:
    model = await start(nursery, FakeEngine())
    async with model.open_sequence(prompt("echo: a b c d"), Sampling(max_tokens=2)) as seq:
        steps = [s async for s in seq]
    assert [s.finish for s in steps if isinstance(s, TokenStep)] == [None, "length"]


class _GatedEngine(FakeEngine):
    """Its prefill phase waits until the reader has received the tokens the decode phase
    of the same step produced; it counts the steps where they never came."""

    def __init__(self) -> None:
        super().__init__(prefill_chunk=20)
        self.delivered = threading.Event()
        self.late = 0
        self.gated = 0

    def decode(self) -> list[TokenStep]:
        self.delivered.clear()
        return super().decode()

    def prefill(self) -> list[TokenStep]:
        if self.phases and self.phases[-1][1]:  # the decode phase just produced tokens
            self.gated += 1
            if not self.delivered.wait(timeout=2):
                self.late += 1
        return super().prefill()


async def test_a_steps_decoded_tokens_are_delivered_before_its_prefill(
    nursery: trio.Nursery,
) -> None:
    engine = _GatedEngine()
    model = await start(nursery, engine)
    long_prompt = prompt("echo: x " + "y" * 400)  # 20 prompt tokens a step: many steps

    async def read(text: str, sampling: Sampling) -> None:
        async with model.open_sequence(prompt(text), sampling) as seq:
            async for _ in seq:
                engine.delivered.set()

    async with trio.open_nursery() as inner:
        inner.start_soon(read, "echo: " + " ".join(["w"] * 40), Sampling(max_tokens=40))
        await wait_until(lambda: engine.steps > 3)
        async with model.open_sequence(long_prompt, Sampling(max_tokens=2)) as seq:
            async for _ in seq:
                pass
    assert engine.gated > 10  # steps that decoded while the long prompt was read
    assert engine.late == 0
