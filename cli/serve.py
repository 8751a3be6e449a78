"""Serving the real model from the command line: pick the model folder and its names,
load the fast BLAS before anything imports MLX, build the engine factory the model thread
calls, and run the server (`mlxcel.app.serve`) in a Trio run until SIGINT or SIGTERM and
its drain; SIGHUP reads the keys file again meanwhile."""

from __future__ import annotations

import functools
import logging
import signal
from pathlib import Path

import trio

from mlxcel.app import check_tool_parser, serve, served_names
from mlxcel.cli.prompt_cache import resolve_prompt_cache_dir
from mlxcel.config import Settings
from mlxcel.errors import ConfigError
from mlxcel.generation import ModelNames
from mlxcel.keys import Keyring
from mlxcel.model.engine import EngineFactory, LoadedModel

log = logging.getLogger(__name__)

DEFAULT_ALIAS = "qwen2.5-coder-0.5b-instruct"


def resolve_model(settings: Settings) -> tuple[Path, ModelNames]:
    """The model folder to load and the names clients may call it by."""
    if settings.model is None:
        from mlxcel.model.provision.fetch import default_model_dir, is_ready

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


def load_model(path: Path, names: ModelNames, settings: Settings) -> LoadedModel:
    """The engine factory for the real model: runs on the model actor's thread."""
    from mlxcel.model.blas import describe, load_fast_blas

    blas = load_fast_blas()
    from mlxcel.model.mlx_load import load_mlx_model

    line = describe(blas)
    (log.info if blas.fast else log.warning)("%s", line)
    if not blas.fast:
        log.warning("MLX runs on the slow reference BLAS: expect generation 20-40x slower")
    return load_mlx_model(
        path,
        name=names.alias,
        max_batch=settings.parallel,
        prefill_step_size=settings.prefill_step_size,
        max_step_ms=settings.max_step_ms,
        blas=blas,
        ctx_size=settings.ctx_size,
        prompt_cache_bytes=settings.prompt_cache_bytes,
        prompt_cache_dir=settings.prompt_cache_dir,
        prompt_cache_disk_bytes=settings.prompt_cache_disk_bytes,
    )


def run(settings: Settings) -> None:
    """Serve `settings` until interrupted (the console commands' entry point)."""
    check_tool_parser(settings.tool_call_parser)  # a bad name stops us before anything starts
    keyring = Keyring.load(settings.api_keys, settings.api_key_file)  # so does a bad key
    path, names = resolve_model(settings)
    served_names(names, settings.model_aliases)  # so does an alias to another model
    settings = resolve_prompt_cache_dir(settings)  # and a --prompt-cache-dir not writable
    from mlxcel.model.blas import load_fast_blas

    load_fast_blas()  # before anything imports mlx.core
    factory = functools.partial(load_model, path, names, settings)
    log.info("loading %s from %s", names.alias, path)
    serve_until_signalled(settings, factory, names, keyring)


def serve_until_signalled(
    settings: Settings,
    factory: EngineFactory,
    names: ModelNames,
    keyring: Keyring | None = None,
) -> None:
    """Run the server in a new Trio run until SIGINT or SIGTERM and its drain (SIGHUP
    reads the keys file again); a ConfigError found while starting comes out as itself."""
    if keyring is None:
        keyring = Keyring.load(settings.api_keys, settings.api_key_file)
    serving = functools.partial(_serve_until_signalled, settings, factory, names, keyring)
    try:
        trio.run(serving)
    except BaseExceptionGroup as group:
        # A setting found wrong while starting (a store file another server holds) is
        # reported as such, not as the nurseries' traceback.
        wrong, _ = group.split(ConfigError)
        if wrong is None:
            raise
        first: BaseException = wrong
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None


async def _serve_until_signalled(
    settings: Settings, factory: EngineFactory, names: ModelNames, keyring: Keyring
) -> None:
    """Serve until SIGINT or SIGTERM, drain, and return normally; a second signal stops
    everything at once. SIGHUP reloads the keys file meanwhile."""
    shutdown = trio.Event()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def serve_then_stop() -> None:
                await serve(settings, factory, names, shutdown=shutdown, keyring=keyring)
                nursery.cancel_scope.cancel()  # drained: stop listening for signals

            nursery.start_soon(serve_then_stop)
            await nursery.start(reload_keys_on_sighup, keyring)
            async for signum in signals:
                name = signal.Signals(signum).name
                if shutdown.is_set():
                    log.warning("%s again: stopping at once", name)
                    nursery.cancel_scope.cancel()
                    break
                log.info("%s: draining (a second signal stops at once)", name)
                shutdown.set()


async def reload_keys_on_sighup(
    keyring: Keyring, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """On each SIGHUP, read the keys file again (the flags' keys stay); a file that cannot
    be read or parsed leaves the keys as they were. Logs name keys, never show them.

    Resource handling: owns the SIGHUP handler until cancelled; reports ready once the
    handler is installed. Error handling: a bad file is logged, never raised, whatever
    the error (cancellation is a BaseException and passes)."""
    with trio.open_signal_receiver(signal.SIGHUP) as hangups:
        task_status.started()
        async for _ in hangups:
            if keyring.path is None:
                log.info("SIGHUP: no --api-key-file to read again")
                continue
            try:
                entries = await trio.to_thread.run_sync(keyring.reload)
            except ConfigError as exc:
                kept = len(keyring.entries)
                log.error("SIGHUP: %s; keeping the %d keys in use", exc.message, kept)
                continue
            except Exception:
                # A reload never ends the server: whatever a file does to the parser, the
                # keys in use stay. Not logged with its traceback: it could quote a key.
                kept = len(keyring.entries)
                log.error(
                    "SIGHUP: the keys file could not be read; keeping the %d keys in use", kept
                )
                continue
            names = ", ".join(entry.name for entry in entries) or "none"
            log.info("SIGHUP: %d API keys now (%s)", len(entries), names)
