"""The webhook sender: announces the end of each background response to the operator's
webhook (`mlxcel.webhooks`), from the deliveries the store keeps (`store/deliveries.py`).

The job supervisor keeps a delivery for each job it admits whose tenant has a target
(`WebhooksHandle.watch`), before the job is registered, and tells the sender when the job
has ended (`WebhooksHandle.ended`, over a bounded channel: a full one only delays the
announcement until the next recheck). A tenant keeps at most its share of the store's
deliveries: beyond it, its new jobs run unannounced (logged and counted), so one tenant
cannot fill the store for the others. The sender claims due deliveries from the store as
its lanes free (`actors/webhook_lanes.py`: attempts at once per tenant, per target URL
and in all), starts each attempt as a task of its own, within its timeout, and settles
it: delivered or given up, it is dropped; failed, it is kept due again after a jittered
exponential backoff. No attempt waits for another, so a receiver that hangs delays only
its own tenant's deliveries. A delivery whose end is not known yet (its job runs, here or
on another replica, or its process died) is rechecked every `watch_secs` against the
stored response: a job reaped after a crash is announced `response.failed`. The target is
looked up when the delivery is claimed, by its tenant, from the flags and the keys file
only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable

import httpx
import trio

from mlxcel.actors.webhook_lanes import IN_FLIGHT, Lanes
from mlxcel.errors import StoreUnavailable
from mlxcel.items import ResponseRecord
from mlxcel.metrics import Metrics
from mlxcel.store import Added, Delivery, StoreHandle
from mlxcel.webhooks import (
    EVENT_TYPES,
    WebhookTarget,
    backoff_secs,
    event_body,
    new_event_id,
    signed_headers,
)

log = logging.getLogger(__name__)

LEASE_MARGIN_SECS = 5.0
"""A claim outlasts an attempt's timeout by this much, so it is settled before it lapses."""
ENDED_BUFFER = 256
"""Ends waiting for the sender; beyond it, `ended` leaves the end to the recheck."""
POLL_SECS = 1.0
"""The longest the sender waits before it looks for due deliveries again (another
replica's retries, deliveries rechecked)."""

Targets = Callable[[str], WebhookTarget | None]
"""A tenant's webhook target as configured now, or None."""


@dataclasses.dataclass(frozen=True, slots=True)
class WebhookPolicy:
    """How the sender tries: attempts per delivery, one attempt's timeout, the first
    backoff, how often an unknown end is rechecked, and the most deliveries one tenant
    keeps pending."""

    max_attempts: int = 8
    timeout_secs: float = 10.0
    backoff_secs: float = 2.0
    watch_secs: float = 5.0
    max_pending_per_key: int = 1_000


class WebhooksHandle:
    """What the job supervisor holds: `watch` a job at admission, say when it `ended`."""

    def __init__(
        self,
        store: StoreHandle,
        targets: Targets,
        ends: trio.MemorySendChannel[Delivery],
        policy: WebhookPolicy,
        metrics: Metrics,
    ) -> None:
        self._store = store
        self._targets = targets
        self._ends = ends
        self._policy = policy
        self._metrics = metrics

    async def watch(self, record: ResponseRecord) -> Delivery | None:
        """Keep a delivery for the job of `record` when its tenant has a target; it is
        sent once the job's end is known. None when there is no target or it could not
        be kept (the job runs unannounced; logged and counted)."""
        if self._targets(record.tenant) is None:
            return None
        delivery = Delivery(record.id, new_event_id(), record.tenant)
        share = self._policy.max_pending_per_key
        try:
            added = await self._store.deliveries.add(delivery, self._policy.watch_secs, share=share)
        except StoreUnavailable:
            log.warning("the store is unavailable; response %s is not announced", record.id)
            self._metrics.webhook_refused.labels("store_unavailable").inc()
            return None
        if added is Added.KEPT:
            return delivery
        if added is Added.TENANT_FULL:
            log.warning(
                "key %r keeps %d pending webhook deliveries, its share; response %s is not "
                "announced",
                record.tenant,
                share,
                record.id,
            )
            self._metrics.webhook_refused.labels("key_full").inc()
        else:
            log.warning("webhook deliveries are full; response %s is not announced", record.id)
            self._metrics.webhook_refused.labels("store_full").inc()
        return None

    def ended(self, delivery: Delivery, final: ResponseRecord) -> None:
        """The job of `delivery` ended as `final`: announce it now (never blocks)."""
        if final.status not in EVENT_TYPES:
            return
        known = dataclasses.replace(delivery, status=final.status, created_at=int(time.time()))
        # When full or closed, the recheck reads the end from the store.
        with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError):
            self._ends.send_nowait(known)


class WebhookSender:
    """The actor: see the module docstring."""

    def __init__(
        self,
        store: StoreHandle,
        targets: Targets,
        policy: WebhookPolicy = WebhookPolicy(),
        metrics: Metrics | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._store = store
        self._targets = targets
        self._policy = policy
        self._metrics = metrics or Metrics()
        self._transport = transport
        """None for the network; tests give one of their own."""
        self._lanes = Lanes()
        self._wake = trio.Event()
        self._soonest = math.inf
        """When the earliest retry this sender settled is due (Trio's clock)."""

    async def run(
        self, *, task_status: trio.TaskStatus[WebhooksHandle] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Send due deliveries until cancelled.

        Resource handling: one HTTP client (no redirects followed: only the configured
        URL is posted to; answers are not read), at most `IN_FLIGHT` attempts at once,
        each a task of this actor's nursery (fewer per tenant and per target: `Lanes`),
        ends waiting in a channel of `ENDED_BUFFER`. Cancelling it cuts the attempts in
        flight; their deliveries stay claimed in the store until the lease lapses, then
        whoever runs next (a restart, another replica) sends them.

        Error handling: a receiver that fails, hangs or cannot be reached costs one
        attempt of its own tenant's, never another's; a store that cannot be reached is
        retried after `POLL_SECS`; nothing a receiver does stops the sender.
        """
        send, recv = trio.open_memory_channel[Delivery](ENDED_BUFFER)
        timeout = httpx.Timeout(self._policy.timeout_secs)
        limits = httpx.Limits(max_connections=IN_FLIGHT, max_keepalive_connections=IN_FLIGHT)
        client = httpx.AsyncClient(
            timeout=timeout, limits=limits, follow_redirects=False, transport=self._transport
        )
        async with client, trio.open_nursery() as nursery:
            nursery.start_soon(self._take_ends, recv)
            handle = WebhooksHandle(self._store, self._targets, send, self._policy, self._metrics)
            task_status.started(handle)
            while True:
                if not await self._claim(nursery, client):
                    await self._sleep()

    async def _claim(self, nursery: trio.Nursery, client: httpx.AsyncClient) -> bool:
        """Start an attempt at each due delivery the lanes have room for; whether to claim
        again at once (every one asked for came, and room is left)."""
        free = self._lanes.free
        if free <= 0:
            return False
        lease = self._policy.timeout_secs + LEASE_MARGIN_SECS
        try:
            batch = await self._store.deliveries.claim(
                free, lease, each=self._lanes.each, rooms=self._lanes.rooms()
            )
        except StoreUnavailable:
            return False
        except Exception:  # a row this release cannot read: never the server's end
            log.exception("webhook deliveries could not be claimed")
            return False
        for delivery in batch:
            target = self._targets(delivery.tenant)
            lane = target.url if target is not None else ""
            if self._lanes.take(delivery.tenant, lane):
                nursery.start_soon(self._attempt, client, delivery, target, lane)
                continue
            # Its target is at its bound (a tenant the claim could not know shares it):
            # due again now, unattempted (an end made known meanwhile kept); the next
            # claims leave its tenant alone.
            unknown = delivery.status is None
            with contextlib.suppress(StoreUnavailable):  # else due when its lease lapses
                await self._store.deliveries.add(delivery, 0.0, settle=True, unknown_only=unknown)
        return len(batch) == free and self._lanes.free > 0

    async def _sleep(self) -> None:
        """Until an attempt ends, an end arrives, this sender's earliest retry is due, or
        `POLL_SECS`."""
        now = trio.current_time()
        if self._soonest <= now:
            self._soonest = math.inf
        wait = min(POLL_SECS, self._policy.watch_secs, self._soonest - now)
        with trio.move_on_after(max(0.0, wait)):
            await self._wake.wait()
        self._wake = trio.Event()

    async def _attempt(
        self,
        client: httpx.AsyncClient,
        delivery: Delivery,
        target: WebhookTarget | None,
        lane: str,
    ) -> None:
        """One attempt in the lanes `take` counted it in; frees them and wakes the sender."""
        try:
            await self._settle(client, delivery, target)
        finally:
            self._lanes.give(delivery.tenant, lane)
            self._wake.set()

    async def _take_ends(self, ends: trio.MemoryReceiveChannel[Delivery]) -> None:
        """Make each ended job's delivery due now (unless a recheck already read its end),
        and wake the sender."""
        async for delivery in ends:
            try:
                await self._store.deliveries.add(delivery, 0.0, settle=True, unknown_only=True)
            except StoreUnavailable:
                continue  # kept unknown: the recheck finds the end once the store answers
            self._wake.set()

    async def _settle(
        self, client: httpx.AsyncClient, delivery: Delivery, target: WebhookTarget | None
    ) -> None:
        """One attempt at `delivery` (to its tenant's `target` when it was claimed), then
        keep or drop it; never raises but Cancelled."""
        deliveries = self._store.deliveries
        try:
            if delivery.status is None:
                await self._recheck(delivery)
            elif target is None:
                log.warning(
                    "no webhook is configured for response %s any more", delivery.response_id
                )
                self._metrics.webhook_deliveries.labels("failed").inc()
                await deliveries.drop(delivery.response_id)
            elif await self._post(client, target, delivery):
                self._metrics.webhook_deliveries.labels("succeeded").inc()
                await deliveries.drop(delivery.response_id)
            elif (attempts := delivery.attempts + 1) >= self._policy.max_attempts:
                log.warning(
                    "the webhook of response %s failed %d times; given up",
                    delivery.response_id,
                    attempts,
                )
                self._metrics.webhook_deliveries.labels("failed").inc()
                await deliveries.drop(delivery.response_id)
            else:
                wait = backoff_secs(attempts, self._policy.backoff_secs)
                retry = dataclasses.replace(delivery, attempts=attempts)
                if await deliveries.add(retry, wait, settle=True):
                    self._soonest = min(self._soonest, trio.current_time() + wait)
        except StoreUnavailable:
            pass  # claimed: due again when its lease lapses
        except Exception:
            log.exception("the webhook of response %s failed", delivery.response_id)

    async def _recheck(self, delivery: Delivery) -> None:
        """Read the end of `delivery`'s job from the stored response: once it has one, the
        delivery is kept known and due now, for the next claim to send (never sent from
        here: the job's own end may have made it known and claimed meanwhile); while it
        runs, it is looked at again after `watch_secs`; a response gone drops it."""
        record = await self._store.get(delivery.response_id)
        deliveries = self._store.deliveries
        if record is None:
            log.warning("response %s is gone before its webhook was sent", delivery.response_id)
            await deliveries.drop(delivery.response_id)
        elif record.status not in EVENT_TYPES:  # queued or in progress: not ended yet
            await deliveries.add(delivery, self._policy.watch_secs, settle=True, unknown_only=True)
        else:
            known = dataclasses.replace(delivery, status=record.status, created_at=int(time.time()))
            await deliveries.add(known, 0.0, settle=True, unknown_only=True)

    async def _post(
        self, client: httpx.AsyncClient, target: WebhookTarget, delivery: Delivery
    ) -> bool:
        """One signed POST; True on a 2xx answer, False on any other, a failed
        connection or the attempt's timeout."""
        assert delivery.status is not None
        body = event_body(
            delivery.event_id, delivery.status, delivery.response_id, delivery.created_at
        )
        headers = signed_headers(target.key, delivery.event_id, int(time.time()), body)
        self._metrics.webhook_attempts.inc()
        with trio.move_on_after(self._policy.timeout_secs):
            try:
                async with client.stream(
                    "POST", target.url, content=body, headers=headers
                ) as answer:
                    if 200 <= answer.status_code < 300:
                        return True
                    reason = f"HTTP {answer.status_code}"
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                reason = type(exc).__name__
            log.info("webhook attempt for response %s failed: %s", delivery.response_id, reason)
            return False
        log.info("webhook attempt for response %s timed out", delivery.response_id)
        return False
