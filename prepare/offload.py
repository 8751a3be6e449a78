"""Request preparation off the event loop: rendering, tokenising and hashing a long input
take CPU time that would otherwise stall every stream and `/health`.

One limiter per Trio run bounds how many preparations run at once, so a burst of large
requests queues here instead of crowding out the event loop and the model thread.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import trio
from trio.lowlevel import RunVar

T = TypeVar("T")

# Two: the machines this serves have few cores, and the event loop and the model thread
# need theirs; two still lets a small request be prepared beside one huge one.
PREPARE_THREADS = 2

_limiter: RunVar[trio.CapacityLimiter] = RunVar("mlxcel_prepare_limiter")


def prepare_limiter() -> trio.CapacityLimiter:
    """The run's shared limiter (one per Trio run, as a test may start several)."""
    try:
        return _limiter.get()
    except LookupError:
        limiter = trio.CapacityLimiter(PREPARE_THREADS)
        _limiter.set(limiter)
        return limiter


async def off_loop(fn: Callable[..., T], *args: object, **kwargs: object) -> T:
    """`fn(*args, **kwargs)` in a worker thread; cancellation waits for it (it is bounded)."""
    call = functools.partial(fn, *args, **kwargs)
    return await trio.to_thread.run_sync(call, limiter=prepare_limiter())
