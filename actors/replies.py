"""Answering a one-shot reply channel, which every actor does the same way."""

from __future__ import annotations

import contextlib
from typing import TypeVar

import trio

T = TypeVar("T")


def answer(reply: trio.MemorySendChannel[T], value: T) -> None:
    """Answer a one-shot reply channel (buffer 1); a requester that left changes nothing."""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
        reply.send_nowait(value)
