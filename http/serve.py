"""Hypercorn serving the routes inside the root nursery."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from quart_trio import QuartTrio


async def serve_http(
    app: QuartTrio,
    host: str,
    port: int,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] = trio.sleep_forever,
    graceful_timeout: float = 2.0,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled, or until `shutdown_trigger` returns and the open connections
    have closed (at most `graceful_timeout` later); reports the bound URLs (port 0 picks
    a free one)."""
    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = "-"
    config.graceful_timeout = graceful_timeout
    config.keep_alive_timeout = 75.0
    # Agents and benchmarks open hundreds of connections at once; hypercorn's default
    # listen backlog (100) would make the kernel drop the rest. It caps this at somaxconn.
    config.backlog = 2048
    await serve(app, config, shutdown_trigger=shutdown_trigger, task_status=task_status)
