"""The webhook sender as an actor, on a memory store: started in a nursery, it delivers a
job's end; stopped mid-attempt, it leaves the delivery claimed in the store, and the next
sender sends it once the claim's lease lapses; a tenant without a target is not watched."""

from __future__ import annotations

import base64
import dataclasses
import time

import trio

from mlxcel.actors.webhooks import LEASE_MARGIN_SECS, WebhookPolicy, WebhookSender
from mlxcel.items import RequestEcho, ResponseRecord, new_id
from mlxcel.store.actor import StoreActor, StoreHandle
from mlxcel.store.limits import StoreLimits
from mlxcel.webhooks import WebhookTarget

from support import in_thread
from webhook_receiver import HANG, SECRET, receiver, unwrap

KEY = base64.b64decode(SECRET.removeprefix("whsec_"))
POLICY = WebhookPolicy(max_attempts=3, timeout_secs=0.3, backoff_secs=0.05, watch_secs=0.2)


async def _store(nursery: trio.Nursery) -> StoreHandle:
    limits = StoreLimits(10, 1 << 20, 0)
    handle: StoreHandle = await nursery.start(StoreActor(limits, limits, 60).run)
    return handle


def _queued(tenant: str = "") -> ResponseRecord:
    return ResponseRecord(new_id("resp"), 0, "queued", RequestEcho(model="m"), tenant=tenant)


async def test_started_it_delivers_stopped_mid_attempt_the_next_sender_does(
    nursery: trio.Nursery,
) -> None:
    store = await _store(nursery)
    with receiver([HANG]) as hook:
        target = WebhookTarget(hook.url, KEY)
        job = _queued()
        async with trio.open_nursery() as first:
            handle = await first.start(WebhookSender(store, lambda _: target, POLICY).run)
            delivery = await handle.watch(job)
            assert delivery is not None
            handle.ended(delivery, dataclasses.replace(job, status="completed"))
            (cut,) = await in_thread(hook.wait_for, 1)
            first.cancel_scope.cancel()  # stopped while its attempt hangs
        stopped = time.monotonic()
        assert await store.deliveries.claim(10, 1.0) == ()  # still claimed by the cut attempt
        await nursery.start(WebhookSender(store, lambda _: target, POLICY).run)
        _, sent = await in_thread(hook.wait_for, 2)
    assert sent.at - stopped >= POLICY.timeout_secs + LEASE_MARGIN_SECS - 0.5
    assert sent.headers["webhook-id"] == cut.headers["webhook-id"]
    event = unwrap(sent)
    assert event.type == "response.completed"
    assert event.data.id == job.id


async def test_a_tenant_without_a_target_is_not_watched_and_one_unknown_is_read_from_the_store(
    nursery: trio.Nursery,
) -> None:
    store = await _store(nursery)
    with receiver() as hook:
        target = WebhookTarget(hook.url, KEY)
        sender = WebhookSender(store, lambda tenant: target if tenant == "a" else None, POLICY)
        handle = await nursery.start(sender.run)
        assert await handle.watch(_queued("b")) is None
        watched = _queued("a")
        await store.put(dataclasses.replace(watched, status="in_progress"))
        assert await handle.watch(watched) is not None
        await trio.sleep(3 * POLICY.watch_secs)
        assert hook.hits == []  # still running: rechecked, not sent
        await store.put(dataclasses.replace(watched, status="incomplete"))
        (hit,) = await in_thread(hook.wait_for, 1)  # its end read from the store
    event = unwrap(hit)
    assert event.type == "response.incomplete"
    assert event.data.id == watched.id
