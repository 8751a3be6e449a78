"""The Redis backend: one store that several replicas share (`--store redis://...`).

Every operation is one Lua script (`store/redis/scripts.py`, `job_scripts.py`,
`deliveries.py`), so Redis runs it as one atomic step: budgets, TTL and LRU hold
whichever replica writes, and no write lands inside another. A conversation change is
written back only if the transcript is still the one read (compare-and-set on its
version), so concurrent appends from any replica are never lost. Keys: `{PREFIX}:...`.

Time is this process's wall clock by default (a TTL means the same on every replica and
after a restart); a replica's lease runs on the Redis server's clock. An unreachable store
answers `StoreUnavailable` (503) until it can; the client reconnects by itself.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import coredis
import trio
from coredis.commands.script import Script
from coredis.exceptions import RedisError
from coredis.retry import NoRetryPolicy

import mlxcel.store.redis.job_scripts as job_lua
import mlxcel.store.redis.scripts as lua
from mlxcel.errors import ConfigError
from mlxcel.items import Conversation, Item, ResponseRecord
from mlxcel.store.backend import (
    MAX_CHAIN_HOPS,
    Chain,
    Charge,
    JobOwner,
    UnreadableJobs,
    changed_conversation,
    final_table,
    reaped,
    too_large,
    window,
)
from mlxcel.store.codec import encode
from mlxcel.store.limits import StoreLimits
from mlxcel.store.redis.deliveries import RedisDeliveries
from mlxcel.store.redis.upgrade import upgrade
from mlxcel.store.redis.values import (
    FAILURES,
    decode_response,
    decode_stored,
    found_items,
    item_places,
    limits_args,
    link,
    owner_arg,
    parse_owner,
    unavailable,
)
from mlxcel.store.tables import (
    ConversationChange,
    Refused,
    Stored,
    StoreStatistics,
    Table,
    TableStatistics,
)

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECS = 2.0
COMMAND_TIMEOUT_SECS = 5.0
"""A command that gets no answer this long (Redis paused or cut off) answers 503."""
OFF_LOOP_BYTES = 1 << 20  # bodies this large are decoded in a worker thread, not on the loop
COUNTER_SLACK_SECS = 60
"""A rate-limit window's key outlives its window this long, for replicas whose clocks
differ a little (a later window is another key, so it is never counted twice)."""
MAX_CONFLICTS = 1000
"""Compare-and-set retries of one conversation change before it answers 503: far above
what any number of concurrent writers to one transcript causes."""


class RedisBackend:
    """`StoreBackend` on a Redis server (see `store/backend.py`)."""

    def __init__(
        self,
        client: coredis.Redis[bytes],
        prefix: str,
        limits: dict[Table, StoreLimits],
        clock: Callable[[], float],
        echo_bytes: int = 0,
    ) -> None:
        self._client = client
        self.base = "{" + prefix + "}:"  # what every key of this store begins with
        self._limits = limits
        self._clock = clock
        self._echo_bytes = echo_bytes
        self._stack = contextlib.AsyncExitStack()
        self._closed = False
        self._scripts: dict[str, Script[bytes]] = {}
        self._unreadable = UnreadableJobs()  # the dead jobs its reaps could not read
        self.deliveries = RedisDeliveries(self._run)  # pending webhook deliveries

    @classmethod
    async def open(
        cls,
        url: str,
        prefix: str,
        responses: StoreLimits,
        conversations: StoreLimits,
        ephemeral: StoreLimits,
        *,
        echo_bytes: int = 0,
        clock: Callable[[], float] | None = None,
    ) -> RedisBackend:
        """Connect and check the server; ConfigError when it cannot be reached or evicts
        keys on its own: any `maxmemory-policy` but `noeviction` (`allkeys-*` would drop
        job records, `volatile-*` the keys with an expiry: replica leases, rate-limit windows)."""
        try:
            client = coredis.Redis.from_url(
                url,
                connect_timeout=CONNECT_TIMEOUT_SECS,
                stream_timeout=COMMAND_TIMEOUT_SECS,
                retry_policy=NoRetryPolicy(),
            )
        except (ValueError, KeyError, TypeError, OSError) as exc:  # an option refused
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "bad option"
            raise ConfigError(
                f"the Redis store at {_where(url)} cannot be used: {reason}"
            ) from None
        limits = {
            Table.RESPONSES: responses,
            Table.CONVERSATIONS: conversations,
            Table.EPHEMERAL: ephemeral,
        }
        backend = cls(client, prefix, limits, clock or time.time, echo_bytes)
        where = _where(url)
        try:
            await backend._stack.enter_async_context(client)
            policy = await _eviction_policy(client)
        except BaseException as exc:
            await backend._stack.aclose()
            if isinstance(exc, FAILURES):
                raise ConfigError(f"cannot reach the Redis store at {where}: {exc}") from None
            raise
        if policy not in ("noeviction", ""):
            await backend._stack.aclose()
            raise ConfigError(
                f"the Redis store at {where} has maxmemory-policy {policy}: it would evict "
                "stored responses, background jobs or replica leases on its own; run it "
                "with noeviction"
            )
        await upgrade(client, backend.base, backend._run)
        return backend

    # --- the protocol ----------------------------------------------------------------

    async def put(self, table: Table, value: Stored) -> bool:
        limits = self._limits[table]
        body = encode(value)
        if not limits.enabled or len(body) > limits.max_bytes:
            log.info("%s is larger than its store's byte budget; not kept", value.id)
            return False
        await self._run(
            lua.PUT,
            table.value,
            value.id,
            body,
            *limits_args(limits),
            link(value),
            item_places(table, value),
        )
        return True

    async def get(self, tables: tuple[Table, ...], key: str) -> Stored | None:
        found = await self._run(lua.GET, key, *(t.value for t in tables))
        if found is None:
            return None
        if len(found[1]) < OFF_LOOP_BYTES:
            return decode_stored(found[1])
        return await trio.to_thread.run_sync(decode_stored, found[1])  # a big record

    async def get_chain(self, response_id: str) -> Chain:
        missing, *bodies = await self._run(lua.CHAIN, response_id, str(MAX_CHAIN_HOPS))
        if sum(len(body) for body in bodies) < OFF_LOOP_BYTES:
            records = tuple(decode_response(body) for body in bodies)
        else:
            records = await trio.to_thread.run_sync(lambda: tuple(map(decode_response, bodies)))
        return Chain(records, missing.decode() or None)

    async def find_items(self, ids: frozenset[str], tenant: str = "") -> dict[str, Item]:
        if not ids:
            return {}
        return found_items(await self._run(lua.FIND_ITEMS, tenant, *sorted(ids)))

    async def delete(self, table: Table, key: str) -> bool:
        return bool(await self._run(lua.DELETE, table.value, key))

    async def change_conversation(
        self, conversation_id: str, change: ConversationChange, create: bool
    ) -> Conversation | Refused:
        table, limits = Table.CONVERSATIONS.value, self._limits[Table.CONVERSATIONS]
        for _ in range(MAX_CONFLICTS):
            found = await self._run(lua.GET_VERSIONED, table, conversation_id)
            current = decode_stored(found[0]) if found is not None else None
            if not isinstance(current, Conversation):
                current = None
            updated = changed_conversation(current, conversation_id, change, create)
            if isinstance(updated, Refused) or updated is current:
                return updated
            body = encode(updated)
            if not limits.enabled or len(body) > limits.max_bytes:
                return Refused.FULL  # what was there stays
            version = found[1].decode() if found is not None else ""
            args = (*limits_args(limits), "", "[]", version)
            if await self._run(lua.PUT_IF_VERSION, table, conversation_id, body, *args):
                return updated
            await trio.sleep(random.uniform(0, 0.002))  # another writer won: read again
        raise unavailable("a conversation kept changing under this write")

    async def statistics(self) -> StoreStatistics:
        flat = await self._run(lua.STATISTICS)
        of = [TableStatistics(int(flat[n]), int(flat[n + 1])) for n in range(0, 8, 2)]
        return StoreStatistics(*of)

    async def register_job(self, record: ResponseRecord, owner: JobOwner) -> None:
        await self._run(
            job_lua.REGISTER_JOB, record.id, encode(record), link(record), owner_arg(owner)
        )

    async def update_job(self, record: ResponseRecord, owner: JobOwner) -> bool:
        return bool(
            await self._run(job_lua.UPDATE_JOB, record.id, encode(record), owner_arg(owner))
        )

    async def finish_job(self, final: ResponseRecord, owner: JobOwner) -> ResponseRecord | None:
        kept, spec = self._final_spec(final)
        if await self._run(job_lua.FINISH_JOB, final.id, owner_arg(owner), *spec):
            return kept
        return None

    async def request_cancel(self, response_id: str) -> JobOwner | None:
        owner = await self._run(job_lua.REQUEST_CANCEL, response_id)
        return None if owner is None else parse_owner(owner)

    async def reap(self, owner: JobOwner) -> int:
        """End the unfinished jobs of every owner but `owner` whose lease is gone (a
        replica holding its lease is alive: its jobs are its own)."""
        flat = await self._run(job_lua.DEAD_JOBS, owner_arg(owner))
        jobs = [(flat[n].decode(), flat[n + 2], flat[n + 1]) for n in range(0, len(flat), 3)]
        ended = 0
        for job_id, record, dead in self._unreadable.readable(jobs):
            _, failed = self._final_spec(reaped(record, cancel_requested=False))
            _, cancelled = self._final_spec(reaped(record, cancel_requested=True))
            ended += await self._run(job_lua.REAP_JOB, job_id, dead, *failed, *cancelled)
        return ended

    async def remember(self, key: str, reasoning: str) -> None:
        await self._run(lua.REMEMBER, key, reasoning, str(self._echo_bytes))

    async def recall(self, keys: tuple[str, ...]) -> dict[str, str]:
        if not keys:
            return {}
        flat = await self._run(lua.RECALL, *keys)
        return {flat[n].decode(): flat[n + 1].decode() for n in range(0, len(flat), 2)}

    async def charge(self, counter: str, amount: int, limit: int, window_secs: int) -> Charge:
        start, resets_in = window(self._clock(), window_secs)
        key = f"rate:{window_secs}:{start}:{counter}"
        life_ms = str(round((resets_in + COUNTER_SLACK_SECS) * 1000))
        allowed, used = await self._run(job_lua.CHARGE, key, str(amount), str(limit), life_ms)
        return Charge(bool(allowed), int(used), resets_in)

    async def maintain(self) -> None:
        await trio.sleep_forever()  # expired entries go as their tables are written

    async def aclose(self) -> None:
        """Leave the client's context: its connection pool cancels its own tasks and waits
        for them, so a cancel of the caller does not cut it short. Called in no cancel
        scope newer than the one `open` ran in (the pool's task group must be left at the
        depth it was entered)."""
        if not self._closed:
            self._closed = True
            await self._stack.aclose()

    # --- what replicas share: leases and cancel requests ------------------------------

    async def hold_lease(self, owner: JobOwner, lease_secs: float, *, take: bool) -> bool:
        """Take (`take`) or renew `owner`'s lease for `lease_secs` on the server's clock;
        False when it was lost (expired, or another epoch holds it)."""
        ms = str(max(1, round(lease_secs * 1000)))
        flag = "1" if take else "0"
        return bool(await self._run(job_lua.RENEW_LEASE, owner.replica, owner.epoch, ms, flag))

    async def release_lease(self, owner: JobOwner) -> None:
        await self._run(job_lua.RELEASE_LEASE, owner.replica, owner.epoch)

    async def cancels_for(self, owner: JobOwner) -> tuple[str, ...]:
        """The ids of `owner`'s unfinished jobs that were asked to cancel."""
        return tuple(i.decode() for i in await self._run(job_lua.CANCELS_FOR, owner_arg(owner)))

    @contextlib.asynccontextmanager
    async def cancel_requests(self, replica: str) -> AsyncIterator[AsyncIterator[str]]:
        """The ids of jobs asked to cancel on `replica`, as they are asked (at most once
        each: a message sent while disconnected is lost, which the durable flags cover)."""
        channel = self.base + "cancel:" + replica
        try:
            async with self._client.pubsub(
                channels=[channel],
                ignore_subscribe_messages=True,
                retry_policy=NoRetryPolicy(),  # the caller subscribes again after a 503
            ) as sub:

                async def ids() -> AsyncGenerator[str]:
                    async for message in sub:
                        data = message.get("data")
                        if isinstance(data, bytes):
                            yield data.decode()

                async with contextlib.aclosing(ids()) as stream:  # closed here, not by GC
                    yield stream
        except BaseException as exc:
            # The subscription's own tasks fail with the client's errors when Redis goes
            # away, and when it is torn down together with its connection (a cancel);
            # a cancel or another error is raised without them, failures alone as 503.
            failures, rest = _split_failures(exc)
            if rest is None:
                log.error("the Redis store failed: %s", str(failures))
                raise unavailable(str(failures)) from exc
            if failures is None:
                raise
            raise rest from None

    # --- pieces ----------------------------------------------------------------------

    def _final_spec(self, final: ResponseRecord) -> tuple[ResponseRecord, list[str | bytes]]:
        """What a job's end stores (itself, or the small `failed` one when it does not
        fit) and the script arguments that put it."""
        table = final_table(final)
        limits = self._limits[table]
        body = encode(final)
        if not limits.enabled or len(body) > limits.max_bytes:
            final = too_large(final)
            body = encode(final)
        fits = limits.enabled and len(body) <= limits.max_bytes
        entries, budget, ttl = limits_args(limits)
        spec: list[str | bytes] = [table.value, entries, budget, ttl, "1" if fits else "0", body]
        return final, [*spec, link(final), item_places(table, final)]

    async def _run(self, source: str, *args: str | bytes) -> Any:
        """Run one script; StoreUnavailable when Redis cannot be reached or fails."""
        if self._closed:
            raise trio.ClosedResourceError("the store is closed")
        script = self._scripts.get(source)
        if script is None:
            script = self._scripts[source] = self._client.register_script(source)
        now = repr(float(self._clock()))
        try:
            return await script(keys=[], args=[self.base, now, *args])
        except FAILURES as exc:
            log.error("the Redis store failed: %s", str(exc))
            raise unavailable(str(exc)) from exc


async def _eviction_policy(client: coredis.Redis[bytes]) -> str:
    """The server's `maxmemory-policy`; '' when the server does not say (CONFIG renamed
    or refused, as managed services do)."""
    try:
        config = await client.config_get(["maxmemory-policy"])
    except RedisError as exc:
        if isinstance(exc, coredis.exceptions.ConnectionError):
            raise
        log.warning(
            "cannot read the Redis store's maxmemory-policy (%s); make sure it is noeviction", exc
        )
        return ""
    value = config.get(b"maxmemory-policy", b"")
    return value.decode() if isinstance(value, bytes) else str(value)


def _where(url: str) -> str:
    """The URL as it may be logged: no password, no query."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.rpartition('@')[2].split('?')[0]}"


def _split_failures(exc: BaseException) -> tuple[BaseException | None, BaseException | None]:
    """`exc` split into the store's failures and the rest (None for an empty part)."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(FAILURES)
    return (exc, None) if isinstance(exc, FAILURES) else (None, exc)
