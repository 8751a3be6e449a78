"""The webhook sender: announces the end of each background response to the operator's
webhook (`mlxcel.webhooks`), from the deliveries the store keeps (`store/deliveries.py`).

The job supervisor keeps a delivery for each job it admits whose tenant has a target
(`WebhooksHandle.watch`), before the job is registered, and tells the sender when the job
has ended (`WebhooksHandle.ended`, over a bounded channel: a full one only delays the
announcement until the next recheck). The sender claims due deliveries from the store,
posts each (at most `BATCH` at once, each attempt within its timeout) and settles it:
delivered or given up, it is dropped; failed, it is kept due again after a jittered
exponential backoff. A delivery whose end is not known yet (its job runs, here or on
another replica, or its process died) is rechecked every `watch_secs` against the stored
response: a job reaped after a crash is announced `response.failed`. The target is looked
up when the delivery is sent, by its tenant, from the flags and the keys file only.
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

from mlxcel.errors import StoreUnavailable
from mlxcel.items import ResponseRecord
from mlxcel.metrics import Metrics
from mlxcel.store.actor import StoreHandle
from mlxcel.store.deliveries import Delivery
from mlxcel.webhooks import (
    EVENT_TYPES,
    WebhookTarget,
    backoff_secs,
    event_body,
    new_event_id,
    signed_headers,
)

log = logging.getLogger(__name__)

BATCH = 16
"""Deliveries claimed, and posted concurrently, at once."""
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
    backoff, and how often an unknown end is rechecked."""

    max_attempts: int = 8
    timeout_secs: float = 10.0
    backoff_secs: float = 2.0
    watch_secs: float = 5.0


class WebhooksHandle:
    """What the job supervisor holds: `watch` a job at admission, say when it `ended`."""

    def __init__(
        self,
        store: StoreHandle,
        targets: Targets,
        ends: trio.MemorySendChannel[Delivery],
        watch_secs: float,
    ) -> None:
        self._store = store
        self._targets = targets
        self._ends = ends
        self._watch_secs = watch_secs

    async def watch(self, record: ResponseRecord) -> Delivery | None:
        """Keep a delivery for the job of `record` when its tenant has a target; it is
        sent once the job's end is known. None when there is no target or it could not
        be kept (the job runs unannounced; logged)."""
        if self._targets(record.tenant) is None:
            return None
        delivery = Delivery(record.id, new_event_id(), record.tenant)
        try:
            if await self._store.deliveries.add(delivery, self._watch_secs):
                return delivery
            log.warning("webhook deliveries are full; response %s is not announced", record.id)
        except StoreUnavailable:
            log.warning("the store is unavailable; response %s is not announced", record.id)
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
    ) -> None:
        self._store = store
        self._targets = targets
        self._policy = policy
        self._metrics = metrics or Metrics()
        self._wake = trio.Event()
        self._soonest = math.inf
        """When the earliest retry this sender settled is due (Trio's clock)."""

    async def run(
        self, *, task_status: trio.TaskStatus[WebhooksHandle] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Send due deliveries until cancelled.

        Resource handling: one HTTP client (no redirects followed: only the configured
        URL is posted to; answers are not read), at most `BATCH` posts at once, ends
        waiting in a channel of `ENDED_BUFFER`. Cancelling it cuts the attempts in
        flight; their deliveries stay claimed in the store until the lease lapses, then
        whoever runs next (a restart, another replica) sends them.

        Error handling: a receiver that fails, hangs or cannot be reached costs one
        attempt; a store that cannot be reached is retried after `POLL_SECS`; nothing a
        receiver does stops the sender.
        """
        send, recv = trio.open_memory_channel[Delivery](ENDED_BUFFER)
        timeout = httpx.Timeout(self._policy.timeout_secs)
        limits = httpx.Limits(max_connections=BATCH, max_keepalive_connections=BATCH)
        client = httpx.AsyncClient(timeout=timeout, limits=limits, follow_redirects=False)
        async with client, trio.open_nursery() as nursery:
            nursery.start_soon(self._take_ends, recv)
            task_status.started(
                WebhooksHandle(self._store, self._targets, send, self._policy.watch_secs)
            )
            while True:
                try:
                    lease = self._policy.timeout_secs + LEASE_MARGIN_SECS
                    batch = await self._store.deliveries.claim(BATCH, lease)
                except StoreUnavailable:
                    batch = ()
                except Exception:  # a row this release cannot read: never the server's end
                    log.exception("webhook deliveries could not be claimed")
                    batch = ()
                if batch:
                    async with trio.open_nursery() as posts:
                        for delivery in batch:
                            posts.start_soon(self._settle, client, delivery)
                    continue
                await self._sleep()

    async def _sleep(self) -> None:
        """Until an end arrives, this sender's earliest retry is due, or `POLL_SECS`."""
        wait = min(POLL_SECS, self._policy.watch_secs, self._soonest - trio.current_time())
        self._soonest = math.inf
        with trio.move_on_after(max(0.0, wait)):
            await self._wake.wait()
        self._wake = trio.Event()

    async def _take_ends(self, ends: trio.MemoryReceiveChannel[Delivery]) -> None:
        """Make each ended job's delivery due now, and wake the sender."""
        async for delivery in ends:
            try:
                await self._store.deliveries.add(delivery, 0.0, settle=True)
            except StoreUnavailable:
                continue  # kept unknown: the recheck finds the end once the store answers
            self._wake.set()

    async def _settle(self, client: httpx.AsyncClient, delivery: Delivery) -> None:
        """One attempt at `delivery`, then keep or drop it; never raises but Cancelled."""
        deliveries = self._store.deliveries
        try:
            if delivery.status is None:
                known = await self._resolve(delivery)
                if known is None:
                    return
                delivery = known
            target = self._targets(delivery.tenant)
            if target is None:
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

    async def _resolve(self, delivery: Delivery) -> Delivery | None:
        """The delivery with its end read from the stored response; None when it is not
        to be sent now (the job still runs: rechecked later; the response is gone)."""
        record = await self._store.get(delivery.response_id)
        if record is None:
            log.warning("response %s is gone before its webhook was sent", delivery.response_id)
            await self._store.deliveries.drop(delivery.response_id)
            return None
        if record.status not in EVENT_TYPES:  # queued or in progress: not ended yet
            await self._store.deliveries.add(delivery, self._policy.watch_secs, settle=True)
            return None
        return dataclasses.replace(delivery, status=record.status, created_at=int(time.time()))

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
