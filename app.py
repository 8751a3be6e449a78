"""The root nursery: store → model → scheduler → HTTP, each started when the one before
is ready, and all stopped together.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import signal
from pathlib import Path

import trio

from mlxcel.actors.echo import EchoActor
from mlxcel.actors.jobs import JobSupervisor
from mlxcel.actors.scheduler import Scheduler
from mlxcel.actors.store import StoreActor
from mlxcel.config import Settings
from mlxcel.errors import ConfigError
from mlxcel.http.intake import ModelNames
from mlxcel.http.routes import Handles, create_app
from mlxcel.http.serve import serve_http
from mlxcel.model.actor import ModelActor
from mlxcel.model.engine import EngineFactory, LoadedModel

log = logging.getLogger(__name__)

DEFAULT_ALIAS = "qwen2.5-coder-0.5b-instruct"


async def serve(
    settings: Settings,
    factory: EngineFactory,
    names: ModelNames,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run every actor (store → model → scheduler → jobs → HTTP) until cancelled; reports
    the HTTP URLs once listening.

    Resource handling: every actor lives in this one nursery, so cancelling it (Ctrl-C,
    a test leaving its scope) stops them all; the model thread closes its engine.

    Error handling: an actor that crashes cancels the others and the error propagates:
    a half-working server is worse than a stopped one.
    """
    if settings.tool_call_parser is not None:
        factory = functools.partial(_with_tool_parser, factory, settings.tool_call_parser)
    async with trio.open_nursery() as nursery:
        store = await nursery.start(
            StoreActor(
                settings.responses, settings.conversations, settings.background_ephemeral_ttl_secs
            ).run
        )
        echo = await nursery.start(EchoActor(settings.reasoning_echo_max_bytes).run)
        model = await nursery.start(ModelActor(factory, settings.parallel).run)
        scheduler_actor = Scheduler(
            model,
            store,
            echo,
            parallel=settings.parallel,
            max_queue_depth=settings.max_queue_depth,
            keepalive_secs=settings.sse_keepalive_secs,
        )
        scheduler = await nursery.start(scheduler_actor.run)
        supervisor = JobSupervisor(
            scheduler,
            store,
            max_jobs=settings.background_max_jobs,
            max_bytes=settings.responses.max_bytes,
        )
        jobs = await nursery.start(supervisor.run)
        handles = Handles(
            model,
            scheduler,
            store,
            jobs,
            echo,
            names,
            background_enabled=settings.background_enabled,
            api_keys=settings.api_keys,
        )
        app = create_app(handles)
        urls = await nursery.start(serve_http, app, settings.host, settings.port)
        log.info("listening on %s (model %s)", ", ".join(urls), names.alias)
        task_status.started(urls)


def resolve_model(settings: Settings) -> tuple[Path, ModelNames]:
    """The model folder to load and the names clients may call it by."""
    if settings.model is None:
        from mlxcel.model.fetch import default_model_dir, is_ready

        path = default_model_dir()
        if not is_ready(path):
            raise ConfigError(
                "The default model has not been set up yet. Run `mlxcel fetch-model` once "
                "(it obtains and converts it), or pass --model PATH to a local MLX model folder."
            )
        alias = settings.alias or DEFAULT_ALIAS
    else:
        path = settings.model.expanduser().resolve()
        if not (path / "config.json").is_file():
            raise ConfigError(f"--model {settings.model}: not an MLX model folder (no config.json)")
        alias = settings.alias or path.name
    return path, ModelNames(alias=alias, path=str(path))


def _with_tool_parser(factory: EngineFactory, kind: str) -> LoadedModel:
    """The loaded model, with the tool-call format `--tool-call-parser` names."""
    loaded = factory()
    return dataclasses.replace(loaded, info=dataclasses.replace(loaded.info, tool_parser=kind))


def load_model(path: Path, names: ModelNames, settings: Settings) -> LoadedModel:
    """The engine factory for the real model: runs on the model actor's thread."""
    from mlxcel.model.blas import describe, load_fast_blas

    blas = load_fast_blas()
    from mlxcel.model.mlx_engine import load_mlx_model

    line = describe(blas)
    (log.info if blas.fast else log.warning)("%s", line)
    if not blas.fast:
        log.warning("MLX runs on the slow reference BLAS: expect generation 20-40x slower")
    return load_mlx_model(
        path,
        name=names.alias,
        max_batch=settings.parallel,
        prefill_step_size=settings.prefill_step_size,
        blas=blas,
        ctx_size=settings.ctx_size,
        prompt_cache_bytes=settings.prompt_cache_bytes,
    )


def run(settings: Settings) -> None:
    """Serve `settings` until interrupted (the console commands' entry point)."""
    path, names = resolve_model(settings)
    from mlxcel.model.blas import load_fast_blas

    load_fast_blas()  # before anything imports mlx.core
    factory = functools.partial(load_model, path, names, settings)
    log.info("loading %s from %s", names.alias, path)
    trio.run(functools.partial(_serve_until_signalled, settings, factory, names))


async def _serve_until_signalled(
    settings: Settings, factory: EngineFactory, names: ModelNames
) -> None:
    """Serve until SIGINT or SIGTERM, then stop every actor and return normally."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve, settings, factory, names)
            async for signum in signals:
                log.info("%s: stopping", signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                break
