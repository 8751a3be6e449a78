"""The fleet: every configured model by name, and the engines of those loaded.

One server may serve several models (`--model NAME=PATH`, `--models-dir`). Each loaded
model has engines of its own (`fleet/engines.py`: a model actor with its thread, a
scheduler with its slots and line, the engine's prompt cache), started when a request
needs the model and stopped when it is evicted, unloaded by hand or idle. The fleet
decides which are loaded: at most `--max-loaded-models` at once, the least recently used
unpinned one evicted to make room, once its work has drained.

Work holds a model by a lease (`open_model`, `fleet/lease.py`): one per request,
taken before its preparation and held until the last of its work ends (a streamed
response's close, a background job's end), its submissions made through it. An unload
waits for the leases to go; meanwhile new requests for the model wait for its reload.
A holder never waits for another lease, so an unload never waits on work that waits on
it. Everything here runs on the Trio thread, so no lock is needed: each state change
wakes every waiter, who looks again.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

from mlxcel.errors import ConfigError, ModelLoadFailed, ModelNotFound, ModelPinned, ShuttingDown
from mlxcel.fleet.engines import ConfiguredModel, Engines, EngineSpec, run_engines
from mlxcel.fleet.lease import ModelLease
from mlxcel.generation import ModelNames
from mlxcel.metrics import Metrics

log = logging.getLogger(__name__)

STATES = ("loaded", "loading", "unloading", "unloaded")
"""A model's state as `GET /v1/models` reports it."""

DRAIN_SECS = 10.0
"""An unloading model's scheduler, once no lease holds it, gets this long to finish
ending its withdrawn responses before its engines stop."""


@dataclass
class _Load:
    """One load in progress: everyone who asked waits on `done`, then reads `error`."""

    done: trio.Event = field(default_factory=trio.Event)
    error: str | None = None


@dataclass
class _Entry:
    config: ConfiguredModel
    state: str = "unloaded"
    engines: Engines | None = None
    users: int = 0
    """Leases held: work queued, running or being prepared for this model."""
    last_used: float = 0.0
    load: _Load | None = None
    stopped: trio.Event | None = None
    """Set when the engines of the current load have stopped."""
    scope: trio.CancelScope | None = None
    error: str | None = None
    """Why the last load failed (cleared by a load that succeeds)."""


class Fleet:
    """The registry of models: their states, loads, unloads and leases."""

    def __init__(
        self,
        models: Sequence[ConfiguredModel],
        spec: EngineSpec,
        *,
        max_loaded: int = 1,
        idle_unload_secs: float = 0.0,
        metrics: Metrics | None = None,
        after_unload: Callable[[], None] | None = None,
    ) -> None:
        if not models:
            raise ConfigError("no model to serve")
        self._entries = {m.names.alias: _Entry(m) for m in models}
        if len(self._entries) != len(models):
            raise ConfigError("two models have the same name")
        pinned = sum(m.pinned for m in models)
        if max_loaded < 1 or (pinned >= max_loaded and pinned < len(models)):
            raise ConfigError(
                "--max-loaded-models must be at least 1 and leave room beside the "
                f"pinned models ({pinned} pinned, {max_loaded} allowed)"
            )
        self.default = models[0].names.alias
        self._spec = spec
        self._max_loaded = max_loaded
        self._idle = idle_unload_secs
        self._metrics = metrics or Metrics()
        self._after_unload = after_unload
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._closed = False

    async def run(self, *, task_status: trio.TaskStatus[Fleet] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the loaded models' engines and the idle watch until cancelled; the default
        model and the pinned ones start loading at once.

        Resource handling: every model's engines run in this nursery, so cancelling it
        stops them all (each model thread closes its engine). Error handling: a model that
        fails to load is logged and reported to those who asked (`ModelLoadFailed`); the
        others serve on."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for entry in self._entries.values():
                wanted = entry.config.pinned or entry.config.names.alias == self.default
                if wanted and self._room_for_more(entry):
                    self._begin_load(entry)
            if self._idle > 0:
                nursery.start_soon(self._watch_idle)
            task_status.started(self)
            await trio.sleep_forever()  # loads start in this nursery whenever asked

    # --- names and states ---------------------------------------------------------

    def find(self, asked: str | None) -> str:
        """The configured model `asked` names (None: the default); `ModelNotFound`
        (404) for any other name. A model's own names win over another's patterns."""
        if asked is None:
            return self.default
        for key, entry in self._entries.items():
            if ModelNames(entry.config.names.alias, entry.config.names.path).matches(asked):
                return key
        for key, entry in self._entries.items():
            if entry.config.names.matches(asked):
                return key
        raise ModelNotFound(asked, self.listed())

    def listed(self) -> list[str]:
        """Every name a 404 offers: each model's alias, then the patterns."""
        names = [key for key in self._entries]
        for entry in self._entries.values():
            names += list(entry.config.names.patterns)
        return names

    def names(self, key: str) -> ModelNames:
        return self._entries[key].config.names

    def models(self) -> list[tuple[str, str, bool]]:
        """Every configured model as `(name, state, pinned)`, the default first."""
        return [(k, e.state, e.config.pinned) for k, e in self._entries.items()]

    def state(self, key: str) -> str:
        return self._entries[key].state

    def error(self, key: str) -> str | None:
        return self._entries[key].error

    def loaded(self) -> list[Engines]:
        """The engines of every loaded model (shutdown, cancels and statistics ask them)."""
        return [e.engines for e in self._entries.values() if e.engines is not None]

    def can_serve(self) -> bool:
        """A model is loaded, or none is loading and one could be loaded on demand."""
        states = [e.state for e in self._entries.values()]
        if "loaded" in states:
            return True
        if "loading" in states or "unloading" in states:
            return False
        return any(e.error is None for e in self._entries.values())

    # --- leases -------------------------------------------------------------------

    @asynccontextmanager
    async def open_model(self, asked: str | None) -> AsyncIterator[ModelLease]:
        """The lease of one request on the model it names (None: the default), held
        for the block and by whatever shares it there: `ModelNotFound` (404) at once
        for a name no configured model answers to, else as `take`."""
        async with await self.take(self.find(asked)) as lease:
            yield lease

    async def take(self, key: str) -> ModelLease:
        """A lease on model `key` (found), once it is loaded, for the caller to end
        (`async with` it): `open_model` without the lookup, for a caller that waits
        for the load in steps of its own (`http/loading.py`)."""
        engines = await self._acquire(key)
        return ModelLease.taken(key, engines, functools.partial(self._release, key))

    async def _acquire(self, key: str) -> Engines:
        """The engines of model `key`, loading it first if it is not loaded (evicting
        another at the limit), with one lease more until `_release`. Raises
        `ModelLoadFailed` (503) when the load fails, `ShuttingDown` when the server
        stops. Many callers of an unloaded model share one load; a model being unloaded
        is loaded again once its unload is over."""
        entry = self._entries[key]
        while True:
            if self._closed:
                raise ShuttingDown("The server is shutting down.", code="server_shutting_down")
            if entry.state == "loaded" and entry.engines is not None:
                entry.users += 1
                entry.last_used = trio.current_time()
                return entry.engines
            if entry.state == "unloaded":
                self._begin_load(entry)
            load = entry.load
            if entry.state == "loading" and load is not None:
                await load.done.wait()
                if load.error is not None:
                    raise ModelLoadFailed(
                        f"The model {key!r} could not be loaded: {load.error}",
                        code="model_load_failed",
                    )
            else:
                await self._changed.wait()  # an unload finishing, then a new load

    def _release(self, key: str) -> None:
        """End one lease of model `key`: its idle time starts when the last one ends."""
        entry = self._entries[key]
        entry.users -= 1
        entry.last_used = trio.current_time()
        self._notify()

    # --- loading and unloading ----------------------------------------------------

    async def load(self, key: str) -> None:
        """Load model `key` (as a request for it would) and return once it is loaded."""
        await self._acquire(key)
        self._release(key)

    async def unload(self, key: str) -> None:
        """Unload model `key` once its work has drained; `ModelPinned` (409) if pinned."""
        entry = self._entries[key]
        if entry.config.pinned:
            raise ModelPinned(
                f"The model {key!r} is pinned (--pin): it stays loaded.", code="model_pinned"
            )
        while entry.state == "loading" and entry.load is not None:
            await entry.load.done.wait()
        await self._unload(entry)

    def close(self) -> None:
        """Shutting down: no model loads from now on."""
        self._closed = True
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _begin_load(self, entry: _Entry) -> None:
        assert self._nursery is not None
        entry.state = "loading"
        entry.load = _Load()
        self._nursery.start_soon(self._load, entry, entry.load)
        self._notify()

    async def _load(self, entry: _Entry, load: _Load) -> None:
        """Make room, then start the model's engines; a failure ends the load alone."""
        key = entry.config.names.alias
        started = trio.current_time()
        try:
            await self._make_room(entry)
            assert self._nursery is not None
            await self._nursery.start(self._life, entry)
        except Exception as exc:
            load.error = _reason(exc)
            entry.state, entry.error = "unloaded", load.error
            self._metrics.model_loaded(key, "failed", trio.current_time() - started)
            log.error("model %s could not be loaded: %s", key, load.error)
        else:
            entry.state, entry.error = "loaded", None
            entry.last_used = trio.current_time()
            self._metrics.model_loaded(key, "loaded", trio.current_time() - started)
            log.info("model %s loaded in %.1f s", key, trio.current_time() - started)
        finally:
            entry.load = None
            load.done.set()
            self._notify()

    async def _life(self, entry: _Entry, *, task_status: trio.TaskStatus[None]) -> None:
        """The engines of one load of `entry`, from start to stop; reports started once
        the model is loaded."""
        entry.stopped = stopped = trio.Event()
        entry.scope = scope = trio.CancelScope()
        try:
            with scope:
                await run_engines(self._spec, entry.config, self._set_engines(entry), task_status)
        finally:
            entry.engines = None
            entry.scope = None
            # The engines are stopped (each closing its engine spilled its prompt cache to
            # the disk tier, when there is one); their memory is not yet freed.
            if self._after_unload is not None:
                self._after_unload()  # the model's memory returned to the system
            stopped.set()
            self._notify()

    @staticmethod
    def _set_engines(entry: _Entry) -> Callable[[Engines], None]:
        def set_engines(engines: Engines) -> None:
            entry.engines = engines

        return set_engines

    def _room_for_more(self, entry: _Entry) -> bool:
        others = [e for e in self._entries.values() if e is not entry and e.state != "unloaded"]
        return len(others) < self._max_loaded

    async def _make_room(self, entry: _Entry) -> None:
        """Unload the least recently used unpinned models until `entry` fits the limit."""
        while not self._room_for_more(entry):
            victims = [
                e
                for e in self._entries.values()
                if e is not entry and e.state == "loaded" and not e.config.pinned
            ]
            if not victims:
                await self._changed.wait()  # another unload or load is under way
                continue
            victim = min(victims, key=lambda e: e.last_used)
            log.info("unloading %s to make room", victim.config.names.alias)
            await self._unload(victim)

    async def _unload(self, entry: _Entry) -> None:
        """Stop `entry`'s engines once no lease holds it: its queued, running and
        background work ends first; new work for it waits for the reload."""
        if entry.state == "unloaded":
            return
        if entry.state == "unloading":
            while entry.state == "unloading":
                await self._changed.wait()
            return
        key = entry.config.names.alias
        entry.state = "unloading"
        self._notify()
        started = trio.current_time()
        while entry.users > 0:
            await self._changed.wait()
        if entry.engines is not None:  # what withdrawn responses still store, stored
            with trio.move_on_after(DRAIN_SECS):
                await entry.engines.scheduler.drain()
        stopped, scope = entry.stopped, entry.scope
        if scope is not None:
            scope.cancel()
        if stopped is not None:
            await stopped.wait()
        entry.state = "unloaded"
        self._metrics.model_unloaded(key, trio.current_time() - started)
        log.info("model %s unloaded", key)
        self._notify()

    async def _watch_idle(self) -> None:
        """Unload each unpinned model no lease has held for `--idle-unload-secs`."""
        tick = min(1.0, self._idle / 4)
        while True:
            await trio.sleep(tick)
            now = trio.current_time()
            for entry in self._entries.values():
                idle = entry.users == 0 and now - entry.last_used >= self._idle
                if entry.state == "loaded" and not entry.config.pinned and idle:
                    assert self._nursery is not None
                    log.info("model %s idle for %g s", entry.config.names.alias, self._idle)
                    self._nursery.start_soon(self._unload, entry)


def _reason(exc: BaseException) -> str:
    """A failed load's cause in one line, for the requester (the log has the rest)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
