"""The root nursery: model → scheduler → jobs → HTTP, each started when the one before
is ready, and all stopped together, inside the store (with the reasoning-echo cache),
which is opened first and closed last.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence

import trio

from mlxcel.actors.jobs import JobsHandle, JobSupervisor
from mlxcel.actors.webhooks import WebhookPolicy, WebhookSender, WebhooksHandle
from mlxcel.config import Settings
from mlxcel.errors import ConfigError
from mlxcel.fleet import ConfiguredModel, EngineSpec, Fleet, FleetScheduler
from mlxcel.generation import ModelNames
from mlxcel.http.browser import BrowserPolicy
from mlxcel.http.routes import Handles, create_app
from mlxcel.http.serve import serve_http
from mlxcel.http.sse import numbered_frame
from mlxcel.keys import KeyLimits, Keyring
from mlxcel.metrics import Metrics
from mlxcel.model.engine import EngineFactory, LoadedModel
from mlxcel.prepare.policy import ClientPolicy
from mlxcel.quotas import AdminBuckets, Limiter
from mlxcel.respond.tool_parsers import PARSERS
from mlxcel.store import StoreActor, StoreHandle
from mlxcel.webhooks import WebhookTarget

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_SECS = 5.0
"""How long after the drain the HTTP server waits for connections to close by themselves."""


async def serve(
    settings: Settings,
    factory: EngineFactory,
    names: ModelNames,
    *,
    more: Sequence[ConfiguredModel] = (),
    after_unload: Callable[[], None] | None = None,
    shutdown: trio.Event | None = None,
    keyring: Keyring | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run every actor (store → model → scheduler → jobs → HTTP) until cancelled,
    or until `shutdown` is set and the drain is over; reports the HTTP URLs once listening.

    Resource handling: every actor but the store lives in this one nursery, and the store
    is opened around it, so the store closes only after the last actor is done.
    Cancelling it (a second signal, a test leaving its scope) stops them all; the model
    thread closes its engine.
    Setting `shutdown` drains instead: no new connections or generations, in-flight
    responses get `--shutdown-timeout-secs` to finish, then every one still running is
    ended with its terminal event, and only then do the actors stop.

    Error handling: an actor that crashes cancels the others and the error propagates:
    a half-working server is worse than a stopped one. No request can make an actor
    crash: each actor fails the one response at fault.
    """
    if shutdown is None:
        shutdown = trio.Event()
    if keyring is None:
        keyring = Keyring.load(settings.api_keys, settings.api_key_file, settings.admin_keys)
    check_tool_parser(settings.tool_call_parser)
    models = configured_models(settings, [ConfiguredModel(names, factory), *more])
    store_actor = StoreActor(
        settings.responses,
        settings.conversations,
        settings.background_ephemeral_ttl_secs,
        store=settings.store,
        echo_bytes=settings.reasoning_echo_max_bytes,
        key_prefix=settings.redis_key_prefix,
        lease_secs=settings.replica_lease_secs,
        max_events_per_response=settings.max_events_per_response,
    )
    # The store outlives every other actor: it closes once the last of them is done.
    async with store_actor.open() as store, trio.open_nursery() as nursery:
        handles = await _start_actors(
            nursery, settings, models, after_unload, shutdown, store, keyring
        )
        app = create_app(
            handles,
            body_timeout_secs=settings.body_timeout_secs,
            access_log=settings.access_log,
            browser=BrowserPolicy.of(settings.cors_origins, settings.host),
        )
        async with trio.open_nursery() as edge:
            http = functools.partial(
                serve_http,
                app,
                settings.host,
                settings.port,
                max_connections=settings.max_connections,
                header_timeout=settings.read_timeout_secs,
                shutdown_trigger=shutdown.wait,
                # A backstop only: the drain ends every response before this runs out.
                graceful_timeout=settings.shutdown_timeout_secs + SHUTDOWN_GRACE_SECS,
            )
            urls = await edge.start(http)
            served = ", ".join(m.names.alias for m in models)
            log.info("listening on %s (models: %s)", ", ".join(urls), served)
            task_status.started(urls)
            grace = settings.shutdown_timeout_secs
            edge.start_soon(_drain, shutdown, grace, handles.scheduler, handles.jobs)
        # HTTP has stopped and every response has ended: stop the actors.
        nursery.cancel_scope.cancel()


async def _start_actors(
    nursery: trio.Nursery,
    settings: Settings,
    models: Sequence[ConfiguredModel],
    after_unload: Callable[[], None] | None,
    shutdown: trio.Event,
    store: StoreHandle,
    keyring: Keyring,
) -> Handles:
    """Start the fleet (each model's engines: model → scheduler) → jobs in `nursery`,
    each once the one before is ready; the handles the HTTP edge talks to."""
    metrics = Metrics()
    echo = store.echo
    spec = EngineSpec(
        store,
        echo,
        parallel=settings.parallel,
        max_queue_depth=settings.max_queue_depth,
        keepalive_secs=settings.sse_keepalive_secs,
        send_timeout_secs=settings.send_timeout_secs,
        metrics=metrics,
    )
    fleet_actor = Fleet(
        models,
        spec,
        max_loaded=settings.max_loaded_models,
        idle_unload_secs=settings.idle_unload_secs,
        metrics=metrics,
        after_unload=after_unload,
    )
    fleet: Fleet = await nursery.start(fleet_actor.run)
    scheduler = FleetScheduler(fleet)
    supervisor = JobSupervisor(
        store,
        max_jobs=settings.background_max_jobs,
        max_bytes=settings.responses.max_bytes,
        metrics=metrics,
        encode=numbered_frame,
        webhooks=await _start_webhooks(nursery, settings, store, keyring, metrics),
    )
    jobs = await nursery.start(supervisor.run)
    return Handles(
        fleet,
        scheduler,
        store,
        jobs,
        echo,
        fleet.names(fleet.default),
        background_enabled=settings.background_enabled,
        keyring=keyring,
        policy=ClientPolicy(
            ignore_hosted_tools=settings.hosted_tools == "ignore",
            image_placeholders=settings.images == "placeholder",
        ),
        keepalive_secs=settings.sse_keepalive_secs,
        progress_events=settings.progress_events,
        websocket_idle_secs=settings.websocket_idle_secs,
        stopping=shutdown,
        metrics=metrics,
        metrics_public=settings.metrics_public,
        limiter=Limiter(store.charge, default_limits(settings), keyring.limits_of),
        admin_calls=AdminBuckets(settings.admin_rate_limit_rpm),
    )


async def _start_webhooks(
    nursery: trio.Nursery,
    settings: Settings,
    store: StoreHandle,
    keyring: Keyring,
    metrics: Metrics,
) -> WebhooksHandle | None:
    """The webhook sender, when a webhook is configured or a keys file could give a key
    one (on SIGHUP too); a replica without any never takes another's deliveries."""
    server = settings.webhook
    if server is None and keyring.path is None and not any(k.webhook for k in keyring.entries):
        return None

    def target(tenant: str) -> WebhookTarget | None:
        return keyring.webhook_of(tenant) or server

    policy = WebhookPolicy(
        max_attempts=settings.webhook_max_attempts,
        timeout_secs=settings.webhook_timeout_secs,
        backoff_secs=settings.webhook_backoff_secs,
        max_pending_per_key=settings.webhook_max_pending_per_key,
        # A job whose process died is reaped within a lease; its end is read this often.
        watch_secs=settings.replica_lease_secs / 3,
    )
    handle: WebhooksHandle = await nursery.start(WebhookSender(store, target, policy, metrics).run)
    return handle


def default_limits(settings: Settings) -> KeyLimits:
    """Every key's limits, but where the keys file gives a key its own."""
    return KeyLimits(settings.rate_limit_rpm, settings.rate_limit_tpm, settings.daily_token_quota)


async def _drain(
    shutdown: trio.Event, grace_secs: float, scheduler: FleetScheduler, jobs: JobsHandle
) -> None:
    """After `shutdown`: let in-flight responses finish within `grace_secs`, then end the
    rest (running jobs `failed`, requests `incomplete`, each with its terminal event)."""
    await shutdown.wait()
    log.info("stopping: in-flight responses get up to %g s to finish", grace_secs)
    with trio.move_on_after(grace_secs) as late:
        await scheduler.drain()
    if late.cancelled_caught:
        log.warning("stopping: ending the responses still in flight")
    await jobs.end_all()
    await scheduler.end_all()


def configured_models(
    settings: Settings, models: Sequence[ConfiguredModel]
) -> list[ConfiguredModel]:
    """`models` with the `--model-alias` patterns given to the model each names, the
    `--pin`s marked and the `--tool-call-parser` applied; a pattern or pin that names no
    model is a `ConfigError` at start, not a 404 on every request it would catch."""
    aliases: dict[str, list[tuple[str, str]]] = {m.names.alias: [] for m in models}
    for pattern, target in settings.model_aliases:
        owner = next((m for m in models if m.names.matches(target)), None)
        if owner is None:
            served = ", ".join(repr(m.names.alias) for m in models)
            raise ConfigError(
                f"--model-alias {pattern}={target}: {target!r} is not a served model "
                f"(they answer to {served} and their folders' names)"
            )
        aliases[owner.names.alias].append((pattern, target))
    for pin in settings.pinned_models:
        if not any(m.names.matches(pin) for m in models):
            raise ConfigError(f"--pin {pin}: no served model has that name")
    configured = []
    for m in models:
        factory = m.factory
        if settings.tool_call_parser is not None:
            factory = functools.partial(_with_tool_parser, factory, settings.tool_call_parser)
        pinned = any(m.names.matches(pin) for pin in settings.pinned_models)
        names = served_names(m.names, tuple(aliases[m.names.alias]))
        configured.append(ConfiguredModel(names, factory, pinned or m.pinned))
    return configured


def served_names(names: ModelNames, aliases: tuple[tuple[str, str], ...]) -> ModelNames:
    """The model's names with the `--model-alias` patterns that name it: every route
    finds a request's model by these (`Fleet.open_model`)."""
    try:
        return names.aliased(aliases)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_tool_parser(kind: str | None) -> None:
    """`--tool-call-parser`, when given, must name a known tool-call format."""
    if kind is not None and kind not in PARSERS:
        raise ConfigError(f"--tool-call-parser must be one of {', '.join(PARSERS)}")


def _with_tool_parser(factory: EngineFactory, kind: str) -> LoadedModel:
    """The loaded model, with the tool-call format `--tool-call-parser` names."""
    loaded = factory()
    return dataclasses.replace(loaded, info=dataclasses.replace(loaded.info, tool_parser=kind))
