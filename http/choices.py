"""`n` choices of one Chat Completions or Completions request: `n` responses on one prompt.

Each choice is a response of its own on a generation slot of its own, so admission
counts `n`: the choices are submitted in one step, all admitted or all refused (503),
so two requests racing for the last slots never leave each other half admitted. The prompt is
prepared once and read once where the prompt cache is on: the engine holds a waiting
prompt that shares an uncached prefix with one being read until that one is read,
then starts it from the cached KV state, so the other `n - 1` choices read only the
prompt's last token. With a `seed`, choice `i` draws with `seed + i` (choice 0 is
what `n: 1` gives); without one, each draws from its own fresh generator.

A stream interleaves the choices' chunks as they come, each with its `index`; the
usage chunk (`stream_options.include_usage`) comes once, after the last choice ends,
summed as OpenAI sums it (the prompt once, the completions' tokens added). A client
that hangs up closes every choice's stream, which frees every slot.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

import trio

from mlxcel.actors.response_stream import ResponseStream, release, submit_together
from mlxcel.errors import GenerationFailed
from mlxcel.fleet import ModelLease
from mlxcel.generation import GenerationRequest
from mlxcel.http.chat_objects import summed_usage
from mlxcel.http.exchange import exchange_nursery
from mlxcel.http.rate_limits import metered
from mlxcel.http.streaming import bind_to_exchange
from mlxcel.items import ResponseRecord, Usage, new_id
from mlxcel.respond.events import ResponseEvent, ResponseFinished

SEED_SPACE = 2**64
"""The engine's generators take unsigned 64-bit seeds."""


def fan_out(generation: GenerationRequest, n: int) -> list[GenerationRequest]:
    """`n` copies of a prepared request, each a response of its own (the first is
    `generation` itself); seeded choices draw with consecutive seeds."""
    out = [generation]
    seed = generation.sampling.seed
    for index in range(1, n):
        record = dataclasses.replace(generation.record, id=new_id("resp"))
        sampling = dataclasses.replace(
            generation.sampling, seed=None if seed is None else (seed + index) % SEED_SPACE
        )
        out.append(dataclasses.replace(generation, record=record, sampling=sampling))
    return out


async def metered_all(generations: Sequence[GenerationRequest]) -> list[GenerationRequest]:
    """Each choice reserved on the request's key; a refusal gives back what the choices
    before it reserved."""
    done: list[GenerationRequest] = []
    try:
        for generation in generations:
            done.append(await metered(generation))
    except BaseException:
        for generation in done:
            await release(generation)
        raise
    return done


async def submit_all(
    lease: ModelLease, generations: Sequence[GenerationRequest], *, bind: bool
) -> list[ResponseStream]:
    """Every choice submitted to the model `lease` holds in one step, or none
    (`submit_together`): a refusal (503) closes them all and returns their
    reservations. `bind`: each stream closes when the HTTP exchange ends."""
    streams = [lease.stream(g) for g in generations]
    if bind:
        for stream in streams:
            bind_to_exchange(stream)
    await submit_together(streams)
    return streams


async def run_all(
    lease: ModelLease, generations: Sequence[GenerationRequest]
) -> list[ResponseRecord]:
    """Every choice run to its end, together: their final records, in choice order."""
    streams = await submit_all(lease, generations, bind=False)
    records: dict[int, ResponseRecord] = {}

    async def last(index: int, stream: ResponseStream) -> None:
        async for event in stream:
            if isinstance(event, ResponseFinished):
                records[index] = event.record

    try:
        async with trio.open_nursery() as nursery:
            for index, stream in enumerate(streams):
                nursery.start_soon(last, index, stream)
    finally:
        for stream in streams:
            await stream.aclose()  # shielded inside; idempotent
    if len(records) != len(streams):
        raise GenerationFailed("The response ended without a result.")
    return [records[i] for i in range(len(streams))]


def with_summed_usage(records: Sequence[ResponseRecord]) -> ResponseRecord:
    """The first choice's record carrying the usage of all (for the access log)."""
    return dataclasses.replace(records[0], usage=summed_usage([r.usage for r in records]))


class ChoiceEvents:
    """The events of the choices' streams read as one, in the order they come."""

    def __init__(self, streams: Sequence[ResponseStream]) -> None:
        self._streams = list(streams)
        self._send, self._recv = trio.open_memory_channel[ResponseEvent](len(self._streams))
        self._closed = False

    @property
    def response_id(self) -> str:
        return self._streams[0].response_id

    def start(self) -> None:
        """Read every stream from the HTTP exchange's own tasks (they end with it)."""
        exchange = exchange_nursery()
        for stream in self._streams:
            exchange.start_soon(self._forward, stream, self._send.clone())
        self._send.close()

    async def _forward(
        self, stream: ResponseStream, send: trio.MemorySendChannel[ResponseEvent]
    ) -> None:
        async with send:
            async for event in stream:
                try:
                    await send.send(event)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break  # the reader left: `aclose` closes every stream

    async def __anext__(self) -> ResponseEvent:
        try:
            return await self._recv.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        """Leave: every choice's stream closes, which withdraws it and frees its slot."""
        if self._closed:
            return
        self._closed = True
        self._recv.close()
        for stream in self._streams:
            await stream.aclose()


class ChunkTranslator(Protocol):
    """One choice's chunks (`ChatChunks`, `TextChunks`)."""

    def translate(self, event: ResponseEvent) -> list[dict[str, Any]]: ...

    def usage_chunk(self, usage: Usage | None) -> dict[str, Any]: ...


class ChoiceChunks:
    """The chunks of every choice, each from its own translator; the summed usage chunk
    once the last choice has ended (`include_usage`)."""

    def __init__(
        self,
        translators: Sequence[ChunkTranslator],
        generations: Sequence[GenerationRequest],
        *,
        include_usage: bool,
    ) -> None:
        self._translators = list(translators)
        self._index = {g.record.id: i for i, g in enumerate(generations)}
        self._usage: dict[int, Usage | None] = {}
        self._include_usage = include_usage

    def translate(self, event: ResponseEvent) -> list[dict[str, Any]]:
        index = self._index.get(event.response_id)
        if index is None:
            return []
        chunks = self._translators[index].translate(event)
        if isinstance(event, ResponseFinished):
            self._usage[index] = event.record.usage
            ended = len(self._usage) == len(self._translators)
            if ended and self._include_usage:
                usages = [self._usage[i] for i in range(len(self._translators))]
                chunks.append(self._translators[0].usage_chunk(summed_usage(usages)))
        return chunks
