"""The reasoning-echo cache (on every store backend) and its keys."""

from __future__ import annotations

import trio

from mlxcel.items import (
    Compaction,
    FunctionCall,
    FunctionCallOutput,
    InputText,
    Message,
    OutputText,
    Reasoning,
    replay,
)
from mlxcel.store.actor import StoreActor, StoreHandle
from mlxcel.store.echo import EchoHandle, TurnHasher, turn_key, turn_prefix
from mlxcel.store.limits import StoreLimits

from support import key_prefix


async def start(nursery: trio.Nursery, max_bytes: int, store: str = "memory") -> EchoHandle:
    limits = StoreLimits(10, 1 << 20, 0)
    actor = StoreActor(
        limits, limits, 600, store=store, echo_bytes=max_bytes, key_prefix=key_prefix()
    )
    handle: StoreHandle = await nursery.start(actor.run)
    return handle.echo


async def test_remember_recall_and_byte_bound(nursery: trio.Nursery, store_spec: str) -> None:
    echo = await start(nursery, max_bytes=20, store=store_spec)
    await echo.remember("a", "0123456789")
    await echo.remember("b", "0123456789")
    assert await echo.recall(["a", "b", "c"]) == {"a": "0123456789", "b": "0123456789"}
    await echo.remember("c", "xyz")  # evicts the least recently used
    assert set(await echo.recall(["a", "b", "c"])) == {"b", "c"}
    await echo.remember("huge", "x" * 100)  # larger than the budget: not kept
    await echo.remember("blank", "   ")  # blank traces are not recorded
    assert await echo.recall(["huge", "blank"]) == {}


async def test_zero_bytes_disables(nursery: trio.Nursery, store_spec: str) -> None:
    echo = await start(nursery, max_bytes=0, store=store_spec)
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


def test_incremental_prefixes_match_the_replayed_history() -> None:
    """One pass gives, at every item, the prefix of the history as the model sees it, so
    restored keys agree with those remembered after a compaction's replay."""
    system = Message("system", (InputText("be brief"),))
    kept = Compaction("summary", (Message("user", (InputText("old"),)),))
    items = [
        system,
        Message("user", (InputText("a"),)),
        Message("assistant", (OutputText("b"),)),
        kept,
        Message("developer", (InputText("later rule"),)),
        FunctionCall("c1", "f", "{}"),
        FunctionCallOutput("c1", "out"),
        Compaction("again", ()),
        Message("assistant", (OutputText("d"),)),
    ]
    hasher = TurnHasher("m", "sig", "s")
    for index, item in enumerate(items):
        assert hasher.prefix() == turn_prefix("m", "sig", "s", replay(items[:index]))
        hasher.add(item)
    assert hasher.prefix() == turn_prefix("m", "sig", "s", replay(items))
