"""Serving the real model from the command line: pick the model folder and its names,
load the fast BLAS before anything imports MLX, build the engine factory the model thread
calls (the CPU acceleration, `accelerate()`, then the model), and run the server (`mlxcel.app.serve`) in a Trio run until SIGINT or SIGTERM and
its drain; SIGHUP reads the keys file again meanwhile."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import trio

from mlxcel.app import check_tool_parser, configured_models, serve
from mlxcel.cli.prompt_cache import resolve_prompt_cache_dir
from mlxcel.config import Settings
from mlxcel.errors import ConfigError
from mlxcel.fleet import ConfiguredModel
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


def resolve_models(settings: Settings) -> list[tuple[Path, ModelNames]]:
    """Every model the server may load, the default first: `--model PATH` (or the
    embedded default model when no model is named at all), each `--model NAME=PATH`,
    then each MLX folder in `--models-dir` by its folder's name."""
    found: list[tuple[Path, ModelNames]] = []
    if settings.model is not None or not (settings.named_models or settings.models_dir):
        found.append(resolve_model(settings))
    for name, given in settings.named_models:
        path = given.expanduser().resolve()
        if not (path / "config.json").is_file():
            raise ConfigError(f"--model {name}={given}: not an MLX model folder (no config.json)")
        found.append((path, ModelNames(alias=name, path=str(path))))
    if settings.models_dir is not None:
        folder = settings.models_dir.expanduser().resolve()
        if not folder.is_dir():
            raise ConfigError(f"--models-dir {settings.models_dir}: not a folder")
        inside = sorted(p for p in folder.iterdir() if (p / "config.json").is_file())
        if not inside:
            raise ConfigError(f"--models-dir {settings.models_dir}: no MLX model folder in it")
        found += [(p, ModelNames(alias=p.name, path=str(p))) for p in inside]
    seen: set[str] = set()
    for _, names in found:
        if names.alias.lower() in seen:
            raise ConfigError(f"two models are named {names.alias!r}: name them apart")
        seen.add(names.alias.lower())
    return found


def release_memory() -> None:
    """After a model is unloaded: its arrays collected and MLX's buffer cache emptied, so
    the memory goes back to the system rather than waiting in MLX's cache."""
    gc.collect()
    import mlx.core as mx

    mx.clear_cache()
    if sys.platform == "linux":  # glibc keeps freed heap pages until asked to trim them
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)


def load_model(path: Path, names: ModelNames, settings: Settings) -> LoadedModel:
    """The engine factory for the real model: runs on the model actor's thread."""
    from mlxcel.model.native import accelerate

    acceleration = accelerate()  # the BLAS and the CPU kernels, said in one log line
    from mlxcel.model.mlx_load import load_mlx_model

    return load_mlx_model(
        path,
        name=names.alias,
        max_batch=settings.parallel,
        prefill_step_size=settings.prefill_step_size,
        max_step_ms=settings.max_step_ms,
        blas=acceleration.blas,
        ctx_size=settings.ctx_size,
        prompt_cache_bytes=settings.prompt_cache_bytes,
        prompt_cache_dir=settings.prompt_cache_dir,
        prompt_cache_disk_bytes=settings.prompt_cache_disk_bytes,
    )


def run(settings: Settings) -> None:
    """Serve `settings` until interrupted (the console commands' entry point)."""
    check_tool_parser(settings.tool_call_parser)  # a bad name stops us before anything starts
    # So does a bad key.
    keyring = Keyring.load(settings.api_keys, settings.api_key_file, settings.admin_keys)
    settings = resolve_prompt_cache_dir(settings)  # so does a --prompt-cache-dir not writable
    found = resolve_models(settings)
    models = [ConfiguredModel(n, functools.partial(load_model, p, n, settings)) for p, n in found]
    configured_models(settings, models)  # so does an alias or a pin naming no model
    from mlxcel.model.native.blas import load_fast_blas

    load_fast_blas()  # before anything imports mlx.core
    for path, names in found:
        log.info("model %s: %s", names.alias, path)
    first = models[0]
    serve_until_signalled(
        settings, first.factory, first.names, keyring, more=models[1:], after_unload=release_memory
    )


def serve_until_signalled(
    settings: Settings,
    factory: EngineFactory,
    names: ModelNames,
    keyring: Keyring | None = None,
    *,
    more: Sequence[ConfiguredModel] = (),
    after_unload: Callable[[], None] | None = None,
) -> None:
    """Run the server in a new Trio run until SIGINT or SIGTERM and its drain (SIGHUP
    reads the keys file again); a ConfigError found while starting comes out as itself.
    `more`: the models served besides the default one (`factory`, `names`)."""
    if keyring is None:
        keyring = Keyring.load(settings.api_keys, settings.api_key_file, settings.admin_keys)
    serving = functools.partial(
        _serve_until_signalled,
        settings,
        functools.partial(serve, more=more, after_unload=after_unload),
        factory,
        names,
        keyring,
    )
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
    settings: Settings,
    serving: Callable[..., Awaitable[None]],
    factory: EngineFactory,
    names: ModelNames,
    keyring: Keyring,
) -> None:
    """Serve until SIGINT or SIGTERM, drain, and return normally; a second signal stops
    everything at once. SIGHUP reloads the keys file meanwhile."""
    shutdown = trio.Event()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def serve_then_stop() -> None:
                await serving(settings, factory, names, shutdown=shutdown, keyring=keyring)
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
