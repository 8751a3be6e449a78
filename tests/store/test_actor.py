"""The store's limits on every backend (memory, SQLite, Redis), on Trio's fake clock."""

from __future__ import annotations

import dataclasses

import pytest
import trio
import trio.testing
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from mlxcel.config import Settings, StoreLimits
from mlxcel.errors import NotFound
from mlxcel.items import (
    Conversation,
    InputText,
    Message,
    RequestEcho,
    ResponseRecord,
    is_minted_conversation_id,
    new_conversation_id,
    new_id,
)
from mlxcel.store.actor import StoreActor, StoreHandle
from mlxcel.store.codec import encoded_size
from mlxcel.store.item_index import ItemIndex
from mlxcel.store.memory.backend import BoundedTable
from mlxcel.store.tables import AddItems, Refused

from support import key_prefix

DEFAULTS = Settings()

OFF = StoreLimits(0, 0, 0)


def record(rid: str, text: str = "x") -> ResponseRecord:
    return ResponseRecord(
        id=rid,
        created_at=0,
        status="completed",
        echo=RequestEcho(model="m"),
        output=(Message("assistant", (InputText(text),)),),
    )


async def start(
    nursery: trio.Nursery, store_spec: str, limits: StoreLimits, conversations: StoreLimits = OFF
) -> StoreHandle:
    """A store on `store_spec`'s backend, on Trio's (fake) clock."""
    actor = StoreActor(
        limits,
        conversations,
        DEFAULTS.background_ephemeral_ttl_secs,
        store=store_spec,
        clock=trio.current_time,
        key_prefix=key_prefix(),
    )
    handle: StoreHandle = await nursery.start(actor.run)
    return handle


async def test_put_get_delete(nursery: trio.Nursery, store_spec: str) -> None:
    store = await start(nursery, store_spec, StoreLimits(10, 1 << 20, 0))
    assert await store.put(record("a"))
    assert (await store.get("a")) == record("a")
    assert await store.delete("a")
    assert await store.get("a") is None
    assert not await store.delete("a")


async def test_entries_limit_evicts_least_recently_used(
    nursery: trio.Nursery, store_spec: str
) -> None:
    store = await start(nursery, store_spec, StoreLimits(2, 1 << 20, 0))
    await store.put(record("a"))
    await store.put(record("b"))
    assert await store.get("a") is not None  # a read refreshes a's recency
    await store.put(record("c"))
    assert await store.get("b") is None
    assert await store.get("a") is not None
    assert await store.get("c") is not None


async def test_ttl_expires_on_the_fake_clock(
    nursery: trio.Nursery, store_spec: str, autojump_clock: trio.testing.MockClock
) -> None:
    store = await start(nursery, store_spec, StoreLimits(10, 1 << 20, 60))
    await store.put(record("a"))
    await trio.sleep(30)
    assert await store.get("a") is not None  # reading does not extend the TTL
    await trio.sleep(29)
    assert await store.get("a") is not None
    await trio.sleep(2)
    assert await store.get("a") is None
    assert (await store.statistics()).responses.entries == 0


async def test_ttl_zero_never_expires(
    nursery: trio.Nursery, store_spec: str, autojump_clock: trio.testing.MockClock
) -> None:
    store = await start(nursery, store_spec, StoreLimits(10, 1 << 20, 0))
    await store.put(record("a"))
    await trio.sleep(10**7)
    assert await store.get("a") is not None


async def test_byte_budget_alone_evicts(nursery: trio.Nursery, store_spec: str) -> None:
    size = encoded_size(record("a"))
    store = await start(nursery, store_spec, StoreLimits(1000, 2 * size, 0))
    await store.put(record("a"))
    await store.put(record("b"))
    await store.put(record("c"))
    assert await store.get("a") is None  # evicted to make room
    assert await store.get("c") is not None
    await store.put(record("c"))  # replacing an id does not count it twice
    assert await store.get("b") is not None
    stats = (await store.statistics()).responses
    assert stats == type(stats)(entries=2, bytes=2 * size)


async def test_both_limits_at_once(nursery: trio.Nursery, store_spec: str) -> None:
    size = encoded_size(record("a"))
    store = await start(nursery, store_spec, StoreLimits(3, 10 * size, 0))
    for rid in "abcde":
        await store.put(record(rid))
    assert [await store.get(r) is not None for r in "abcde"] == [False, False, True, True, True]
    big = record("f", "y" * (8 * size))
    await store.put(big)
    stats = (await store.statistics()).responses
    assert stats.bytes <= 10 * size
    assert await store.get("f") == big


async def test_entry_exactly_at_budget_is_kept_larger_is_not(
    nursery: trio.Nursery, store_spec: str
) -> None:
    size = encoded_size(record("a"))
    store = await start(nursery, store_spec, StoreLimits(10, size, 0))
    assert await store.put(record("a"))
    assert not await store.put(record("b", "much longer text"))
    assert await store.get("b") is None
    assert await store.get("a") is not None  # an oversized put evicts nothing


@pytest.mark.parametrize("limits", [StoreLimits(0, 1 << 20, 0), StoreLimits(10, 0, 0)])
async def test_disabled_or_zero_budget_keeps_nothing(
    nursery: trio.Nursery, store_spec: str, limits: StoreLimits
) -> None:
    store = await start(nursery, store_spec, limits)
    assert not await store.put(record("a"))
    assert await store.get("a") is None


async def test_conversations_append_create_and_expire(
    nursery: trio.Nursery, store_spec: str, autojump_clock: trio.testing.MockClock
) -> None:
    store = await start(
        nursery, store_spec, StoreLimits(10, 1 << 20, 0), StoreLimits(10, 1 << 20, 100)
    )
    one = Message("user", (InputText("one"),))
    two = Message("assistant", (InputText("two"),))
    conv = await store.append("conv_a", (one,))
    assert conv is not None
    assert conv.items == (one,)
    conv = await store.append("conv_a", (two,))
    assert conv is not None
    assert (await store.get_conversation("conv_a")) == conv
    assert conv.items == (one, two)
    await trio.sleep(101)
    assert await store.get_conversation("conv_a") is None
    assert await store.put_conversation(Conversation("conv_b", 0, {"k": "v"}))
    assert await store.delete_conversation("conv_b")
    assert not await store.delete_conversation("conv_b")


async def test_conversation_store_off_keeps_nothing(nursery: trio.Nursery, store_spec: str) -> None:
    store = await start(
        nursery, store_spec, StoreLimits(10, 1 << 20, 0), StoreLimits(0, 1 << 20, 0)
    )
    assert await store.append("conv_a", (Message("user", (InputText("x"),)),)) is None


class TableMachine(RuleBasedStateMachine):
    """The running byte total equals the live entries' sizes and respects the budget."""

    def __init__(self) -> None:
        super().__init__()
        self.budget = 6 * encoded_size(record("k0"))
        self.table = BoundedTable(StoreLimits(5, self.budget, 0))

    @rule(key=st.sampled_from([f"k{i}" for i in range(8)]), length=st.integers(0, 400))
    def put(self, key: str, length: int) -> None:
        value = record(key, "x" * length)
        kept = self.table.put(key, value)
        assert kept == (encoded_size(value) <= self.budget)
        assert self.table.statistics().bytes <= self.budget

    @rule(key=st.sampled_from([f"k{i}" for i in range(8)]))
    def get(self, key: str) -> None:
        self.table.get(key)

    @rule(key=st.sampled_from([f"k{i}" for i in range(8)]))
    def delete(self, key: str) -> None:
        self.table.delete(key)

    @invariant()
    def bytes_are_the_sum_of_live_entries(self) -> None:
        cache = self.table._cache
        assert cache.currsize == sum(encoded_size(v) for v in cache.values())
        assert len(cache) <= 5


TableMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_table_state_machine() -> None:
    trio.run(_run_machine)


async def _run_machine() -> None:
    # BoundedTable reads Trio's clock, so the machine runs inside a Trio run.
    TableMachine.TestCase().runTest()


def said(text: str) -> Message:
    return Message("user", (InputText(text),))


async def test_an_append_past_the_budget_keeps_the_transcript_as_it_was(
    nursery: trio.Nursery,
    store_spec: str,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    budget = encoded_size(Conversation("conv_a", 0, items=(said("x" * 400),)))
    store = await start(
        nursery, store_spec, StoreLimits(10, 1 << 20, 0), StoreLimits(10, budget, 100)
    )
    kept = await store.append("conv_a", (said("hello"),), response_id="resp_1")
    assert kept is not None
    await trio.sleep(60)
    assert await store.append("conv_a", (said("y" * 500),), response_id="resp_2") is None
    assert "conv_a is full" in caplog.text
    assert await store.get_conversation("conv_a") == kept
    assert (await store.statistics()).conversations.entries == 1
    refused = await store.change("conv_a", AddItems((said("z" * 500),)))
    assert refused is Refused.FULL
    await trio.sleep(41)  # a refused write does not renew the transcript's lifetime
    assert await store.get_conversation("conv_a") is None


def test_a_put_too_large_for_the_table_keeps_the_old_value() -> None:
    async def main() -> None:
        table = BoundedTable(StoreLimits(10, encoded_size(record("a")), 0))
        assert table.put("a", record("a"))
        assert not table.put("a", record("a", "much longer text"))
        assert table.get("a") == record("a")
        assert table.statistics().bytes == encoded_size(record("a"))

    trio.run(main)


async def test_appending_the_same_response_turn_twice_changes_nothing(
    nursery: trio.Nursery, store_spec: str, autojump_clock: trio.testing.MockClock
) -> None:
    store = await start(
        nursery, store_spec, StoreLimits(10, 1 << 20, 0), StoreLimits(10, 1 << 20, 100)
    )
    turn = (said("q"), Message("assistant", (InputText("a"),)))
    first = await store.append("conv_a", turn, response_id="resp_1")
    await trio.sleep(1)
    again = await store.append("conv_a", turn, response_id="resp_1")
    assert again == first
    assert first is not None
    assert first.items == turn
    both = await store.append("conv_a", turn, response_id="resp_2")
    assert both is not None
    assert both.items == turn + turn
    assert both.response_ids == ("resp_1", "resp_2")
    assert await store.append("conv_a", turn, response_id="resp_1") == both
    plain = await store.append("conv_a", (said("no id"),))  # items without a response: added
    assert plain is not None
    assert len(plain.items) == 5


def test_minted_conversation_ids_are_recognised() -> None:
    minted = new_conversation_id()
    assert minted.startswith("conv_")
    assert len(minted) == 53
    assert is_minted_conversation_id(minted)
    tampered = minted[:-1] + ("0" if minted[-1] != "0" else "1")
    for other in (new_id("conv"), tampered, minted.upper(), minted + "0", "conv_a", "my chat"):
        assert not is_minted_conversation_id(other)


async def test_a_minted_conversation_that_is_gone_is_not_created_again(
    nursery: trio.Nursery, store_spec: str, autojump_clock: trio.testing.MockClock
) -> None:
    store = await start(
        nursery, store_spec, StoreLimits(10, 1 << 20, 0), StoreLimits(10, 1 << 20, 100)
    )
    minted = new_conversation_id()
    assert await store.put_conversation(Conversation(minted, 0))
    assert await store.get_conversation(minted) is not None
    await trio.sleep(101)  # expired
    with pytest.raises(NotFound):
        await store.get_conversation(minted)
    assert await store.append(minted, (said("late turn"),), response_id="resp_1") is None
    assert await store.change(minted, AddItems((said("x"),)), create=True) is Refused.MISSING
    with pytest.raises(NotFound):
        await store.get_conversation(minted)
    assert await store.get_conversation("my-chat") is None  # free-form: created on first use
    assert await store.append("my-chat", (said("hi"),)) is not None


def with_items(rid: str, *item_ids: str) -> ResponseRecord:
    inputs = tuple(Message("user", (InputText(i),), id=i) for i in item_ids[:-1])
    output = (Message("assistant", (InputText("out"),), id=item_ids[-1]),)
    return dataclasses.replace(record(rid), input_items=inputs, output=output)


async def test_items_are_found_by_id_until_their_response_goes(
    nursery: trio.Nursery, store_spec: str, autojump_clock: trio.testing.MockClock
) -> None:
    store = await start(nursery, store_spec, StoreLimits(2, 1 << 20, 100))
    await store.put(with_items("a", "msg_in", "msg_out"))
    found = await store.find_items(frozenset({"msg_in", "msg_out", "msg_other"}))
    assert {k: v.id for k, v in found.items()} == {"msg_in": "msg_in", "msg_out": "msg_out"}
    await store.delete("a")
    assert await store.find_items(frozenset({"msg_in"})) == {}
    await store.put(with_items("b", "msg_b"))
    await trio.sleep(101)  # expired
    assert await store.find_items(frozenset({"msg_b"})) == {}
    await store.put(with_items("c", "msg_c"))
    await store.put(with_items("d", "msg_d"))
    await store.put(with_items("e", "msg_e"))  # the entry cap evicts c
    assert set(await store.find_items(frozenset({"msg_c", "msg_d", "msg_e"}))) == {
        "msg_d",
        "msg_e",
    }


async def test_the_item_index_holds_no_more_than_the_table() -> None:
    table = BoundedTable(StoreLimits(3, 1 << 20, 0), index=ItemIndex())
    for n in range(50):
        table.put(f"r{n}", with_items(f"r{n}", f"msg_{n}_a", f"msg_{n}_b", "msg_shared"))
    assert table.index is not None
    assert len(table.index) == 3 * 2 + 1  # three records' own items and the shared one
    found = table.find_items(frozenset({"msg_shared", "msg_49_a", "msg_0_a"}))
    assert set(found) == {"msg_shared", "msg_49_a"}
    for n in (47, 48, 49):
        table.delete(f"r{n}")
    assert len(table.index) == 0
