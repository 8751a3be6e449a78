"""What every blueprint shares: the handles of the actors behind the API, stored on the
app when it is made, and the one way a JSON answer leaves the server."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any

import trio
from quart import Quart, Response, current_app

from mlxcel.actors.jobs import JobsHandle
from mlxcel.fleet import Fleet, FleetScheduler
from mlxcel.generation import ModelNames
from mlxcel.keys import Keyring
from mlxcel.metrics import Metrics
from mlxcel.prepare.policy import ClientPolicy
from mlxcel.quotas import AdminBuckets, Limiter
from mlxcel.store import EchoHandle, StoreHandle

_KEY = "mlxcel"


@dataclass(frozen=True, slots=True)
class Handles:
    """What the routes talk to."""

    fleet: Fleet
    """Every configured model, its state and its engines when loaded; a route holds
    its model by one lease (`Fleet.open_model`) and submits through it."""
    scheduler: FleetScheduler
    """Cancels, drains and statistics over every loaded model's scheduler."""
    store: StoreHandle
    jobs: JobsHandle
    echo: EchoHandle
    names: ModelNames
    """The default model's names."""
    background_enabled: bool = True
    keyring: Keyring = dataclasses.field(default_factory=Keyring)
    """The API keys accepted; empty, every request is served (one tenant)."""
    policy: ClientPolicy = dataclasses.field(default_factory=ClientPolicy)
    """What the server does with hosted tools and images it cannot serve."""
    keepalive_secs: float = 10.0
    """A stream that sent nothing for this long sends a keep-alive (or `mlx.progress`)."""
    progress_events: bool = True
    """Keep-alives are `mlx.progress` data events rather than SSE comments."""
    websocket_idle_secs: float = 300.0
    """A WebSocket with no response running that sends nothing for this long is closed."""
    stopping: trio.Event = dataclasses.field(default_factory=trio.Event)
    """Set on shutdown: no new generation starts."""
    started: int = dataclasses.field(default_factory=lambda: int(time.time()))
    """When the server started (the model's `created`)."""
    metrics: Metrics = dataclasses.field(default_factory=Metrics)
    metrics_public: bool = False
    """`/metrics` answers without an API key."""
    limiter: Limiter | None = None
    """The API keys' rate limits and quotas; None when no limit can apply."""
    admin_calls: AdminBuckets = dataclasses.field(default_factory=lambda: AdminBuckets(0))
    """Each admin key's model loads and unloads, within `--admin-rate-limit-rpm`."""


def install(app: Quart, handles: Handles) -> None:
    app.extensions[_KEY] = handles


def handles() -> Handles:
    """The handles of the app serving the current request."""
    found: Handles = current_app.extensions[_KEY]
    return found


def json_response(body: Any, status: int = 200) -> Response:
    # Strict JSON out, as in: a NaN would break every strict parser (a ValueError here is
    # a bug, answered as a 500 and logged).
    data = json.dumps(body, allow_nan=False)
    return Response(data, status=status, content_type="application/json")
