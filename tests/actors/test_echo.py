"""The reasoning-echo cache actor and its keys."""

from __future__ import annotations

import trio

from mlxcel.actors.echo import EchoActor, EchoHandle, turn_key, turn_prefix
from mlxcel.items import InputText, Message, Reasoning


async def start(nursery: trio.Nursery, max_bytes: int) -> EchoHandle:
    handle: EchoHandle = await nursery.start(EchoActor(max_bytes).run)
    return handle


async def test_remember_recall_and_byte_bound(nursery: trio.Nursery) -> None:
    echo = await start(nursery, max_bytes=20)
    await echo.remember("a", "0123456789")
    await echo.remember("b", "0123456789")
    assert await echo.recall(["a", "b", "c"]) == {"a": "0123456789", "b": "0123456789"}
    await echo.remember("c", "xyz")  # evicts the least recently used
    assert set(await echo.recall(["a", "b", "c"])) == {"b", "c"}
    await echo.remember("huge", "x" * 100)  # larger than the budget: not kept
    await echo.remember("blank", "   ")  # blank traces are not recorded
    assert await echo.recall(["huge", "blank"]) == {}


async def test_zero_bytes_disables(nursery: trio.Nursery) -> None:
    echo = await start(nursery, max_bytes=0)
    assert not echo.enabled
    await echo.remember("a", "trace")
    assert await echo.recall(["a"]) == {}


def test_keys_ignore_dropped_reasoning_and_trim_text() -> None:
    user = Message("user", (InputText("hi"),))
    with_trace = turn_prefix("m", "sig", "s", [user, Reasoning("t")])
    without = turn_prefix("m", "sig", "s", [user])
    assert with_trace == without
    assert turn_key(without, " answer\n") == turn_key(without, "answer")
    assert turn_prefix("m", "sig", "other", [user]) != without
    assert turn_prefix("m", "other-tools", "s", [user]) != without
