"""The model actor: one long-lived thread that owns the engine (and so MLX).

Every MLX call happens on this one thread, so prefill and decode are serialised and
MLX is never touched from two threads. The thread talks to Trio only through
`trio.from_thread`: after each phase of an engine step (decode, then prefill) it hands
over that phase's events and takes the new sequences and the aborted ones in the same
round trip, so a step's decoded tokens reach their clients before its prefill runs.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass

import trio

from mlxcel.errors import ModelNotReady
from mlxcel.generation import (
    ModelEvent,
    ModelInfo,
    PrefillProgress,
    PromptCodec,
    Sampling,
    SequenceFailed,
    SequenceSpec,
    TokenStep,
)
from mlxcel.metrics import Metrics
from mlxcel.model.engine import Engine, EngineFactory, LoadedModel

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Exchange:
    """What the model thread takes back from Trio after delivering a step's events."""

    new: list[SequenceSpec]
    aborted: list[int]


class ModelHandle:
    """What other actors hold: open sequences, read the loaded model's codec and info."""

    def __init__(self, actor: ModelActor) -> None:
        self._actor = actor
        self.ready = trio.Event()

    @property
    def loaded(self) -> LoadedModel:
        if self._actor.loaded is None:
            raise ModelNotReady("The model is still loading; retry shortly.")
        return self._actor.loaded

    @property
    def codec(self) -> PromptCodec:
        return self.loaded.codec

    @property
    def info(self) -> ModelInfo:
        return self.loaded.info

    def open_sequence(
        self, prompt: list[int], sampling: Sampling, tenant: str = ""
    ) -> AbstractAsyncContextManager[trio.MemoryReceiveChannel[ModelEvent]]:
        """Admit a sequence; yields its events. Leaving early aborts it in the engine.
        Only the `tenant`'s prompt-cache entries serve it."""
        return self._actor.open_sequence(prompt, sampling, tenant)


class ModelActor:
    """Owns the model: one thread holds the engine and MLX, and every prefill and decode step
    runs there in turn, fed by the slots over bounded channels. One owner is what MLX needs
    (its streams and caches are not shared safely across threads) and what continuous
    batching needs (one step at a time over every running sequence)."""

    def __init__(
        self, factory: EngineFactory, max_sequences: int, metrics: Metrics | None = None
    ) -> None:
        self._factory = factory
        self._max_sequences = max_sequences
        self._metrics = metrics or Metrics().for_model("")
        self._ids = itertools.count(1)
        # Per-sequence event channels; touched only on the Trio thread.
        self._routes: dict[int, trio.MemorySendChannel[ModelEvent]] = {}
        self._aborted: set[int] = set()
        self._inbox_send: trio.MemorySendChannel[SequenceSpec] | None = None
        self._inbox_recv: trio.MemoryReceiveChannel[SequenceSpec] | None = None
        self.loaded: LoadedModel | None = None
        self.handle = ModelHandle(self)

    async def run(
        self, *, task_status: trio.TaskStatus[ModelHandle] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the model thread until cancelled.

        Resource handling: the inbox holds at most one new sequence per generation slot
        (the scheduler never has more in flight), so it is bounded by `max_sequences`.
        The engine is created, used and closed on the model thread only.

        Error handling: an engine error while loading propagates (the server cannot
        serve without a model). An engine error while stepping fails every sequence in
        the engine with `SequenceFailed` and the actor carries on with an empty engine;
        one while admitting a sequence fails that sequence alone; one while removing a
        sequence is logged.
        Cancellation reaches the thread between steps and ends it after closing the engine.
        """
        self._inbox_send, self._inbox_recv = trio.open_memory_channel[SequenceSpec](
            self._max_sequences
        )
        task_status.started(self.handle)
        await trio.to_thread.run_sync(self._thread_main, abandon_on_cancel=False)

    # --- Trio side -------------------------------------------------------------

    @asynccontextmanager
    async def open_sequence(
        self, prompt: list[int], sampling: Sampling, tenant: str = ""
    ) -> AsyncIterator[trio.MemoryReceiveChannel[ModelEvent]]:
        """Admit a sequence; yields its events. Leaving early aborts it in the engine."""
        if self.loaded is None or self._inbox_send is None:
            raise ModelNotReady("The model is still loading; retry shortly.")
        seq_id = next(self._ids)
        # A sequence emits at most max_tokens steps (or one failure) and holds at most one
        # prefill report at a time, so this buffer can never fill: the model thread never
        # waits on a slow consumer.
        send, recv = trio.open_memory_channel[ModelEvent](sampling.max_tokens + 2)
        self._routes[seq_id] = send
        try:
            await self._inbox_send.send(SequenceSpec(seq_id, tuple(prompt), sampling, tenant))
            async with recv:
                yield recv
        finally:
            if self._routes.pop(seq_id, None) is not None:
                self._aborted.add(seq_id)
                send.close()

    def _on_loaded(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        if loaded.prompt_disk is not None:
            self._metrics.watch_prompt_disk(loaded.info.name, loaded.prompt_disk)
        self.handle.ready.set()

    def _exchange(self, events: list[ModelEvent]) -> _Exchange:
        aborted = self._deliver(events)
        new: list[SequenceSpec] = []
        assert self._inbox_recv is not None
        while True:
            try:
                spec = self._inbox_recv.receive_nowait()
            except trio.WouldBlock:
                break
            if spec.seq_id in self._aborted:
                self._aborted.discard(spec.seq_id)
            else:
                new.append(spec)
        aborted.extend(self._aborted)
        self._aborted.clear()
        return _Exchange(new, aborted)

    def _deliver(self, events: list[ModelEvent]) -> list[int]:
        """Send each event to its sequence's channel; returns sequences whose reader left."""
        gone: list[int] = []
        for event in events:
            route = self._routes.get(event.seq_id)
            if route is None:
                continue
            if isinstance(event, PrefillProgress):
                # Only into an empty buffer: a reader behind on reports needs no more.
                if route.statistics().current_buffer_used == 0:
                    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                        route.send_nowait(event)
                continue
            finished = isinstance(event, SequenceFailed) or event.finish is not None
            try:
                route.send_nowait(event)
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
                finished = True
                if not isinstance(event, SequenceFailed) and event.finish is None:
                    gone.append(event.seq_id)
            if finished:
                del self._routes[event.seq_id]
                route.close()
        return gone

    async def _wait_for_work(self) -> SequenceSpec:
        assert self._inbox_recv is not None
        return await self._inbox_recv.receive()

    # --- model thread ----------------------------------------------------------

    def _thread_main(self) -> None:
        loaded = self._factory()
        engine = loaded.engine
        log.info("model %s loaded (%s)", loaded.info.name, loaded.info.backend)
        trio.from_thread.run_sync(self._on_loaded, loaded)
        active: set[int] = set()
        try:
            events: list[ModelEvent] = []
            while True:
                trio.from_thread.check_cancelled()
                failed: list[ModelEvent] = []
                if not events and not engine.has_work():
                    engine.idle()
                    first = trio.from_thread.run(self._wait_for_work)
                    failed += self._insert(engine, first, active)
                events = failed + self._trade(engine, active, events)
                if engine.has_work():
                    events += self._timed_step(engine, active)
        finally:
            engine.close()

    def _trade(
        self, engine: Engine, active: set[int], events: list[ModelEvent]
    ) -> list[ModelEvent]:
        """Deliver `events`; drop the aborted sequences and admit the new ones (the
        failures of those the engine refuses come back)."""
        exchange = trio.from_thread.run_sync(self._exchange, events)
        for seq_id in exchange.aborted:
            if seq_id in active:
                active.discard(seq_id)
                self._remove(engine, seq_id)
        failed: list[ModelEvent] = []
        for spec in exchange.new:
            failed += self._insert(engine, spec, active)
        return failed

    @staticmethod
    def _insert(engine: Engine, spec: SequenceSpec, active: set[int]) -> list[ModelEvent]:
        """Admit a sequence; one the engine refuses fails alone."""
        try:
            engine.insert(spec)
        except Exception as exc:
            log.exception("engine could not admit sequence %d", spec.seq_id)
            ModelActor._remove(engine, spec.seq_id)  # whatever half of it got in
            return [SequenceFailed(spec.seq_id, f"generation failed: {exc}")]
        active.add(spec.seq_id)
        return []

    @staticmethod
    def _remove(engine: Engine, seq_id: int) -> None:
        try:
            engine.remove(seq_id)
        except Exception:
            log.exception("engine could not drop sequence %d", seq_id)

    def _timed_step(self, engine: Engine, active: set[int]) -> list[ModelEvent]:
        """Decode, deliver those tokens, then prefill; the whole goes to the step histogram."""
        started = time.perf_counter()
        events = self._phase(engine, active, decoding=True)
        if events:
            events = self._trade(engine, active, events)
        if engine.has_work():
            events += self._phase(engine, active, decoding=False)
        self._metrics.step_seconds.observe(time.perf_counter() - started)
        return events

    @staticmethod
    def _phase(engine: Engine, active: set[int], decoding: bool) -> list[ModelEvent]:
        try:
            if decoding:
                steps: list[ModelEvent] = list(engine.decode())
            else:
                steps = [*engine.prefill(), *engine.prefilling()]
        except Exception as exc:
            log.exception("engine step failed; failing %d sequence(s)", len(active))
            failed: list[ModelEvent] = []
            for seq_id in sorted(active):
                ModelActor._remove(engine, seq_id)
                failed.append(SequenceFailed(seq_id, f"generation failed: {exc}"))
            active.clear()
            return failed
        for step in steps:
            if isinstance(step, TokenStep) and step.finish is not None:
                active.discard(step.seq_id)
        return steps
