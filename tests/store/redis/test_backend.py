"""The Redis backend on a real redis-server: its checks at open, outages, replicas that
share one store (leases, reaping, cancels) and key prefixes that keep stores apart."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import trio

from mlxcel.errors import ConfigError, StoreUnavailable
from mlxcel.items import (
    FunctionCall,
    InputText,
    Message,
    OutputText,
    RequestEcho,
    ResponseRecord,
    ResponseStatus,
)
from mlxcel.store.backend import RESTART_MESSAGE, Chain, JobOwner
from mlxcel.store.limits import StoreLimits
from mlxcel.store.redis.backend import COMMAND_TIMEOUT_SECS, RedisBackend
from mlxcel.store.tables import Table

from redis_server import RedisServer
from support import free_port, key_prefix

ROOMY = StoreLimits(100, 1 << 20, 0)
LEASE_SECS = 0.3
OUTAGE_SECS = COMMAND_TIMEOUT_SECS + 10
"""How long an operation may take to answer 503 when Redis is gone or frozen: its command
timeout, with generous slack for a loaded machine."""


def record(
    rid: str,
    prev: str | None = None,
    item_ids: tuple[str, ...] = (),
    *,
    status: ResponseStatus = "completed",
    text: str = "x",
) -> ResponseRecord:
    output = tuple(
        FunctionCall(f"call_{n}", "f", "{}", id=item_id)
        if item_id.startswith("fc_")
        else Message("assistant", (OutputText(f"{rid}:{text}"),), id=item_id)
        for n, item_id in enumerate(item_ids)
    )
    return ResponseRecord(
        id=rid,
        created_at=0,
        status=status,
        echo=RequestEcho("m", previous_response_id=prev),
        output=output,
        input_items=(Message("user", (InputText("q"),)),),
        background=True,
    )


@contextlib.asynccontextmanager
async def opened(
    url: str, prefix: str, limits: StoreLimits = ROOMY, *, echo_bytes: int = 0
) -> AsyncIterator[RedisBackend]:
    backend = await RedisBackend.open(url, prefix, limits, limits, limits, echo_bytes=echo_bytes)
    try:
        yield backend
    finally:
        await backend.aclose()


# --- checks at open --------------------------------------------------------------------


async def test_a_server_that_evicts_keys_on_its_own_is_refused(own_redis: RedisServer) -> None:
    # allkeys-* would drop job records; volatile-* the keys with an expiry (leases, windows).
    for policy in ("allkeys-lru", "volatile-lru", "volatile-ttl"):
        own_redis.call("CONFIG", "SET", "maxmemory-policy", policy)
        with pytest.raises(ConfigError, match=policy):
            await RedisBackend.open(own_redis.url, key_prefix(), ROOMY, ROOMY, ROOMY)
    own_redis.call("CONFIG", "SET", "maxmemory-policy", "noeviction")
    async with opened(own_redis.url, key_prefix()) as backend:
        assert await backend.put(Table.RESPONSES, record("resp_1"))


async def test_an_unreachable_server_is_a_config_error_at_once() -> None:
    with trio.fail_after(10), pytest.raises(ConfigError, match="cannot reach"):
        await RedisBackend.open(f"redis://127.0.0.1:{free_port()}/0", "p", ROOMY, ROOMY, ROOMY)


@pytest.mark.parametrize(
    "query", ["ssl_ca_certs=/no/such/ca.pem", "ssl_cert_reqs=bogus", "stream_timeout=soon"]
)
async def test_a_url_option_the_client_refuses_is_a_config_error_without_the_password(
    query: str,
) -> None:
    url = f"rediss://:pw-s3cret@127.0.0.1:{free_port()}/0?{query}"
    with trio.fail_after(10), pytest.raises(ConfigError) as caught:
        await RedisBackend.open(url, "p", ROOMY, ROOMY, ROOMY)
    assert "pw-s3cret" not in caught.value.message


# --- outages ---------------------------------------------------------------------------


async def every_operation_is_unavailable(backend: RedisBackend) -> None:
    owner = JobOwner("r", "e")
    operations: list[Callable[[], Awaitable[object]]] = [
        lambda: backend.put(Table.RESPONSES, record("resp_2")),
        lambda: backend.get((Table.RESPONSES,), "resp_1"),
        lambda: backend.get_chain("resp_1"),
        lambda: backend.find_items(frozenset({"msg_a"})),
        lambda: backend.delete(Table.RESPONSES, "resp_1"),
        lambda: backend.statistics(),
        lambda: backend.register_job(record("resp_3", status="queued"), owner),
        lambda: backend.request_cancel("resp_3"),
        lambda: backend.reap(owner),
        lambda: backend.hold_lease(owner, 5, take=True),
        lambda: backend.cancels_for(owner),
    ]
    for operation in operations:
        with trio.fail_after(OUTAGE_SECS), pytest.raises(StoreUnavailable):
            await operation()


async def test_a_stopped_server_answers_unavailable_until_it_is_back(
    own_redis: RedisServer,
) -> None:
    kept = record("resp_1", item_ids=("msg_a",))
    async with opened(own_redis.url, key_prefix()) as backend:
        assert await backend.put(Table.RESPONSES, kept)
        own_redis.stop()
        await every_operation_is_unavailable(backend)
        with trio.fail_after(OUTAGE_SECS), pytest.raises(StoreUnavailable):
            async with backend.cancel_requests("r"):
                pass
        own_redis.start()  # the same port, its append-only file read back
        assert await backend.get((Table.RESPONSES,), "resp_1") == kept
        assert (await backend.find_items(frozenset({"msg_a"})))["msg_a"] == kept.output[0]


async def test_a_frozen_server_times_out_as_unavailable_and_recovers(
    own_redis: RedisServer,
) -> None:
    kept = record("resp_1")
    async with opened(own_redis.url, key_prefix()) as backend:
        assert await backend.put(Table.RESPONSES, kept)
        own_redis.pause()
        try:
            with trio.fail_after(OUTAGE_SECS), pytest.raises(StoreUnavailable):
                await backend.get((Table.RESPONSES,), "resp_1")
        finally:
            own_redis.resume()
        with trio.fail_after(OUTAGE_SECS):
            assert await backend.get((Table.RESPONSES,), "resp_1") == kept
            assert await backend.put(Table.RESPONSES, record("resp_2"))


# --- replicas sharing one store --------------------------------------------------------


@pytest.mark.parametrize("cancel_first", [False, True])
async def test_a_dead_replicas_job_is_reaped_once_after_its_lease(
    redis_store: str, redis_prefix: str, cancel_first: bool
) -> None:
    a_owner, b_owner, c_owner = JobOwner("a", "1"), JobOwner("b", "1"), JobOwner("c", "1")
    async with (
        opened(redis_store, redis_prefix) as a,
        opened(redis_store, redis_prefix) as b,
        opened(redis_store, redis_prefix) as c,
    ):
        assert await a.hold_lease(a_owner, LEASE_SECS, take=True)
        queued = record("resp_job", status="queued")
        await a.register_job(queued, a_owner)
        if cancel_first:
            assert await b.request_cancel("resp_job") == a_owner
        assert await b.reap(b_owner) == 0  # A's lease is live: its job is its own
        assert await b.get((Table.ACTIVE,), "resp_job") == queued

        await trio.sleep(LEASE_SECS + 0.3)  # A stops renewing: its lease expires
        reaped = [0, 0]

        async def reap(n: int, backend: RedisBackend, owner: JobOwner) -> None:
            reaped[n] = await backend.reap(owner)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reap, 0, b, b_owner)
            nursery.start_soon(reap, 1, c, c_owner)
        assert sum(reaped) == 1

        final = await c.get((Table.ACTIVE, Table.RESPONSES), "resp_job")
        assert isinstance(final, ResponseRecord)
        if cancel_first:
            assert final.status == "cancelled"
            assert final.error is None
        else:
            assert final.status == "failed"
            assert final.error is not None
            assert final.error.message == RESTART_MESSAGE
        assert await b.get((Table.ACTIVE,), "resp_job") is None
        assert (await b.statistics()).active.entries == 0

        # A comes back too late: its writes are fenced out and change nothing.
        late = record("resp_job", status="in_progress", text="late")
        assert not await a.update_job(late, a_owner)
        assert await a.finish_job(record("resp_job", text="late"), a_owner) is None
        assert await a.get((Table.RESPONSES,), "resp_job") == final
        assert not await a.hold_lease(a_owner, LEASE_SECS, take=False)
        assert await b.reap(b_owner) == 0


async def test_a_cancel_reaches_the_owner_by_message_and_by_flag(
    redis_store: str, redis_prefix: str
) -> None:
    a_owner, b_owner = JobOwner("a", "1"), JobOwner("b", "1")
    async with opened(redis_store, redis_prefix) as a, opened(redis_store, redis_prefix) as b:
        for rid, owner in (("resp_a1", a_owner), ("resp_a2", a_owner), ("resp_b1", b_owner)):
            await a.register_job(record(rid, status="queued"), owner)
        async with a.cancel_requests("a") as requests:
            assert await b.request_cancel("resp_a1") == a_owner
            assert await b.request_cancel("resp_b1") == b_owner  # another replica's channel
            with trio.fail_after(10):
                assert await anext(aiter(requests)) == "resp_a1"
        assert await b.request_cancel("resp_none") is None
        assert await b.cancels_for(a_owner) == ("resp_a1",)
        assert await a.cancels_for(b_owner) == ("resp_b1",)
        assert await a.cancels_for(JobOwner("a", "2")) == ()  # another epoch of A
        assert await a.finish_job(record("resp_a1", status="cancelled"), a_owner) is not None
        assert await b.cancels_for(a_owner) == ()


# --- items, chains and the echo cache --------------------------------------------------


async def test_items_are_found_in_the_newest_stored_response_holding_them(
    redis_server: RedisServer, redis_prefix: str
) -> None:
    redis_store = redis_server.url
    older = record("resp_1", item_ids=("msg_a", "fc_b"), text="older")
    newer = record("resp_2", item_ids=("msg_a",), text="newer")
    async with opened(redis_store, redis_prefix) as backend:
        assert await backend.put(Table.RESPONSES, older)
        assert await backend.put(Table.RESPONSES, newer)
        assert await backend.put(Table.EPHEMERAL, record("resp_3", item_ids=("msg_e",)))
        found = await backend.find_items(frozenset({"msg_a", "fc_b", "msg_e", "msg_none"}))
        assert found == {"msg_a": newer.output[0], "fc_b": older.output[1]}
        assert await backend.delete(Table.RESPONSES, "resp_2")
        found = await backend.find_items(frozenset({"msg_a"}))
        assert found == {"msg_a": older.output[0]}
        assert await backend.delete(Table.RESPONSES, "resp_1")
        assert await backend.find_items(frozenset({"msg_a", "fc_b"})) == {}
        base = "{" + redis_prefix + "}:"
        assert redis_server.call("HLEN", base + "items") == 0  # the index went with them
        assert redis_server.call("HLEN", base + "responses:itemids") == 0


async def test_a_chain_runs_through_unfinished_jobs_and_stored_responses(
    redis_store: str, redis_prefix: str
) -> None:
    owner = JobOwner("a", "1")
    first, second = record("resp_1"), record("resp_2", "resp_1")
    job = record("resp_3", "resp_2", status="queued")
    async with opened(redis_store, redis_prefix) as backend:
        assert await backend.put(Table.RESPONSES, first)
        assert await backend.put(Table.RESPONSES, second)
        await backend.register_job(job, owner)
        chain = await backend.get_chain("resp_3")
        assert chain.records == (job, second, first)
        assert chain.missing is None
        assert await backend.delete(Table.RESPONSES, "resp_1")
        chain = await backend.get_chain("resp_3")
        assert chain.records == (job, second)
        assert chain.missing == "resp_1"
        assert await backend.put(Table.EPHEMERAL, record("resp_4", "resp_2"))
        assert await backend.get_chain("resp_4") == Chain((), "resp_4")


async def test_the_echo_cache_keeps_its_byte_budget_least_recently_used_first(
    redis_store: str, redis_prefix: str
) -> None:
    async with opened(redis_store, redis_prefix, echo_bytes=10) as backend:
        await backend.remember("k1", "aaaa")
        await backend.remember("k2", "bbbb")
        assert await backend.recall(("k2", "k1", "k0")) == {"k2": "bbbb", "k1": "aaaa"}
        await backend.remember("k3", "cccc")  # k2 was read before k1: k2 goes first
        assert await backend.recall(("k1", "k2", "k3")) == {"k1": "aaaa", "k3": "cccc"}
        await backend.remember("k4", "x" * 11)  # larger than the whole budget: not kept
        assert await backend.recall(("k1", "k3", "k4")) == {"k1": "aaaa", "k3": "cccc"}
        await backend.remember("k1", "dddddd")  # replaced: 6 + 4 bytes fit exactly
        assert await backend.recall(("k1", "k3")) == {"k1": "dddddd", "k3": "cccc"}


# --- key prefixes ----------------------------------------------------------------------


async def test_stores_under_different_prefixes_never_see_each_other(
    redis_store: str,
) -> None:
    owner = JobOwner("a", "1")
    async with (
        opened(redis_store, key_prefix(), echo_bytes=100) as one,
        opened(redis_store, key_prefix(), echo_bytes=100) as two,
    ):
        mine, theirs = record("resp_1", item_ids=("msg_a",)), record("resp_1", text="other")
        assert await one.put(Table.RESPONSES, mine)
        assert await two.put(Table.RESPONSES, theirs)
        await one.register_job(record("resp_job", status="queued"), owner)
        await one.remember("k", "trace")
        assert await two.get((Table.RESPONSES,), "resp_1") == theirs
        assert await two.find_items(frozenset({"msg_a"})) == {}
        assert await two.get((Table.ACTIVE,), "resp_job") is None
        assert await two.request_cancel("resp_job") is None
        assert await two.reap(JobOwner("b", "1")) == 0
        assert await two.recall(("k",)) == {}
        assert (await two.statistics()).active.entries == 0
        assert await two.delete(Table.RESPONSES, "resp_1")
        assert await one.get((Table.RESPONSES,), "resp_1") == mine
        assert (await one.statistics()).active.entries == 1
        assert await one.reap(JobOwner("b", "1")) == 1


async def test_an_earlier_releases_item_index_is_built_afresh_at_start(
    redis_server: RedisServer,
) -> None:
    """A store written with one JSON list per item id is indexed per tenant at the next
    start, and the old keys are gone."""
    prefix = key_prefix()
    base = "{" + prefix + "}:"
    async with opened(redis_server.url, prefix) as backend:
        await backend.put(Table.RESPONSES, record("resp_1", item_ids=("msg_a", "msg_b")))
    for key in redis_server.call("KEYS", base + "ix:*") or []:  # back to the old layout
        redis_server.call("DEL", key)
    redis_server.call("DEL", base + "responses:itemkeys")
    redis_server.call("HSET", base + "responses:itemids", "resp_1", '["msg_a","msg_b"]')
    redis_server.call("HSET", base + "items", "msg_a", '[["resp_1",1]]', "msg_b", '[["resp_1",2]]')
    async with opened(redis_server.url, prefix) as backend:
        found = await backend.find_items(frozenset({"msg_a", "msg_b"}))
        assert sorted(found) == ["msg_a", "msg_b"]
    assert redis_server.call("EXISTS", base + "items", base + "responses:itemids") == 0
