"""One loaded model's engines: its model actor (the thread that owns its MLX engine and
prompt cache) and its scheduler (slots and waiting line), started together and stopped
together by the fleet (`fleet/registry.py`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import trio

from mlxcel.actors.scheduler import Scheduler, SchedulerHandle
from mlxcel.generation import ModelNames, ServedModel
from mlxcel.metrics import Metrics
from mlxcel.model.actor import ModelActor, ModelHandle
from mlxcel.model.engine import EngineFactory
from mlxcel.store import EchoHandle, StoreHandle


@dataclass(frozen=True, slots=True)
class ConfiguredModel:
    """A model the server may load: the names it answers to and how to load it."""

    names: ModelNames
    factory: EngineFactory
    pinned: bool = False
    """Loaded at start and never unloaded (`--pin`)."""


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """What every model's engines are made with: the server's slot and line settings,
    and the store the slots write to."""

    store: StoreHandle
    echo: EchoHandle
    parallel: int
    max_queue_depth: int
    keepalive_secs: float
    send_timeout_secs: float
    metrics: Metrics


@dataclass(frozen=True, slots=True)
class Engines:
    """A loaded model: its model actor's handle and its scheduler's."""

    names: ModelNames
    model: ModelHandle
    scheduler: SchedulerHandle

    def served(self) -> ServedModel:
        """The model as preparation takes it."""
        return ServedModel(self.names, self.model.info, self.model.codec)


async def run_engines(
    spec: EngineSpec,
    config: ConfiguredModel,
    publish: Callable[[Engines], None],
    task_status: trio.TaskStatus[None],
) -> None:
    """Load `config`'s model and run its engines until cancelled; `publish` them and
    report started once the model is loaded. A model that fails to load raises here,
    before started (the model thread's error)."""
    metrics = spec.metrics.for_model(config.names.alias)
    async with trio.open_nursery() as nursery:
        actor = ModelActor(config.factory, spec.parallel, metrics)
        model: ModelHandle = await nursery.start(actor.run)
        await model.ready.wait()  # the model thread's error, if it fails, cancels this
        scheduler_actor = Scheduler(
            model,
            spec.store,
            spec.echo,
            parallel=spec.parallel,
            max_queue_depth=spec.max_queue_depth,
            keepalive_secs=spec.keepalive_secs,
            send_timeout_secs=spec.send_timeout_secs,
            metrics=metrics,
        )
        scheduler: SchedulerHandle = await nursery.start(scheduler_actor.run)
        publish(Engines(config.names, model, scheduler))
        task_status.started()
