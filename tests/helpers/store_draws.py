"""What the store backends' state machine (`tests/store/test_backends.py`) draws:
ids, records, conversation changes, table orders, owners and limits, small enough that
caps, budgets, TTLs and LRU eviction all happen within a few steps."""

from __future__ import annotations

from hypothesis import strategies as st

from mlxcel.items import (
    FunctionCall,
    InputText,
    Item,
    Message,
    OutputText,
    RequestEcho,
    ResponseRecord,
    ResponseStatus,
    new_conversation_id,
)
from mlxcel.store import (
    AddItems,
    ConversationChange,
    JobOwner,
    RemoveItem,
    SetMetadata,
    StoreLimits,
    Table,
)
from mlxcel.store.codec import encoded_size

KEYS = [f"resp_{n}" for n in range(5)]
"""Response ids; a response's `previous_response_id` is always an earlier one (no loops)."""
ITEM_IDS = ["msg_a", "msg_b", "fc_c", None]
MINTED = (new_conversation_id(), new_conversation_id())
CONVERSATION_IDS = ["chat-1", "conv_made_up", *MINTED, "key-b/chat-1", f"key-b/{MINTED[0]}"]
"""Conversation keys: one tenant's ids as they are, another's under its name."""
TENANTS = ["", "key-b"]
CURRENT, STALE, OTHER = JobOwner("a", "2"), JobOwner("a", "1"), JobOwner("b", "2")
PADS = [0, 10, 60, 200, 600, 3000]
"""Text lengths: from small records to ones larger than any budget below."""
START = 1_000_000.0


def response(
    key: str,
    pad: int,
    prev: str | None = None,
    item_ids: tuple[str | None, ...] = (),
    *,
    store: bool = True,
    status: ResponseStatus = "completed",
    tenant: str = "",
) -> ResponseRecord:
    output: tuple[Item, ...] = tuple(
        FunctionCall(f"call_{n}", "f", "{}", id=item_id)
        if item_id is not None and item_id.startswith("fc_")
        else Message("assistant", (OutputText(f"{key}:{n}:" + "x" * pad),), id=item_id)
        for n, item_id in enumerate(item_ids)
    )
    return ResponseRecord(
        id=key,
        created_at=0,
        status=status,
        echo=RequestEcho("m", previous_response_id=prev),
        output=output,
        input_items=(Message("user", (InputText("q" * (pad // 2)),)),),
        tenant=tenant,
        store=store,
        background=True,
    )


UNIT = encoded_size(response("resp_0", 60, "resp_1", ("msg_a",)))
"""About one record: the byte budgets are counted in these."""


@st.composite
def responses(draw: st.DrawFn, key: str | None = None) -> ResponseRecord:
    index = draw(st.integers(0, len(KEYS) - 1)) if key is None else KEYS.index(key)
    # Mostly the one just before, so chains of several turns form.
    prev = (
        draw(st.sampled_from([KEYS[index - 1], KEYS[index - 1], None, *KEYS[:index]]))
        if index
        else None
    )
    item_ids = draw(st.lists(st.sampled_from(ITEM_IDS), max_size=2).map(tuple))
    tenant = draw(st.sampled_from(TENANTS))
    return response(KEYS[index], draw(st.sampled_from(PADS)), prev, item_ids, tenant=tenant)


said = st.builds(
    lambda item_id, pad: Message("user", (InputText("y" * pad),), id=item_id),
    st.sampled_from(["item_a", "item_b", None]),
    st.sampled_from([0, 30, 300, 900]),
)
changes: st.SearchStrategy[ConversationChange] = st.one_of(
    st.builds(
        AddItems,
        st.lists(said, min_size=1, max_size=2).map(tuple),
        st.none() | st.sampled_from(KEYS[:3]),
    ),
    st.builds(RemoveItem, st.sampled_from(["item_a", "item_b", "item_c"])),
    st.builds(
        SetMetadata,
        st.dictionaries(st.sampled_from(["k", "$", "v"]), st.text("ab", max_size=4), max_size=2),
    ),
)
table_tuples = st.sampled_from(
    [
        (Table.RESPONSES,),
        (Table.CONVERSATIONS,),
        (Table.EPHEMERAL,),
        (Table.ACTIVE,),
        (Table.ACTIVE, Table.RESPONSES),
        (Table.RESPONSES, Table.EPHEMERAL),
        (Table.EPHEMERAL, Table.RESPONSES),
        (Table.ACTIVE, Table.RESPONSES, Table.EPHEMERAL),
        (Table.CONVERSATIONS, Table.RESPONSES),
    ]
)
owners = st.sampled_from([CURRENT, STALE, OTHER])
HOLDER = JobOwner("", "")
"""Stands for whoever holds the job now (the machine keeps track), so writes that are not
fenced out happen often."""
job_writers = st.sampled_from([HOLDER, HOLDER, CURRENT, STALE, OTHER])
BOUNDED = (Table.RESPONSES, Table.CONVERSATIONS, Table.EPHEMERAL)
REDIS_PARTS = ("body", "lru", "exp", "bytes", "link", "ver")
"""The keys of one table in Redis (`store/redis/scripts.py`)."""


def limits(entries: range, units: list[float], ttls: list[float]) -> st.SearchStrategy[StoreLimits]:
    return st.builds(
        StoreLimits,
        st.sampled_from(entries),
        st.sampled_from(units).map(lambda u: int(u * UNIT)),
        st.sampled_from(ttls),
    )
