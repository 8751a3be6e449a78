"""The webhook sender as an actor, on a memory store: started in a nursery, it delivers a
job's end; stopped mid-attempt, it leaves the delivery claimed in the store, and the next
sender sends it once the claim's lease lapses; a tenant without a target is not watched.
On Trio's clock, with receivers that never answer: a tenant's hanging receiver holds at
most its own lanes (per tenant, per URL), and another's delivery goes at once."""

from __future__ import annotations

import base64
import dataclasses
import time
from collections import Counter

import httpx
import pytest
import trio
import trio.testing

from mlxcel.actors.webhook_lanes import PER_TARGET, PER_TENANT
from mlxcel.actors.webhooks import LEASE_MARGIN_SECS, WebhookPolicy, WebhookSender, WebhooksHandle
from mlxcel.items import RequestEcho, ResponseRecord, new_id
from mlxcel.store import StoreActor, StoreHandle, StoreLimits
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


class HangingReceivers:
    """A transport answering 200 at once but at the URLs in `hanging`, where it never
    answers; it records each post (time, URL, tenant) and the most in flight at once."""

    def __init__(self, hanging: set[str]) -> None:
        self.hanging = hanging
        self.tenant_of: dict[str, str] = {}
        """Each event's tenant, by its webhook-id."""
        self.posts: list[tuple[float, str, str, str]] = []
        self._flying: Counter[str] = Counter()
        self.most: Counter[str] = Counter()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        url, event = str(request.url), request.headers["webhook-id"]
        tenant = self.tenant_of[event]
        self.posts.append((trio.current_time(), url, tenant, event))
        if url in self.hanging:
            keys = (url, tenant)
            for key in keys:
                self._flying[key] += 1
                self.most[key] = max(self.most[key], self._flying[key])
            try:
                await trio.sleep_forever()
            finally:
                self._flying.subtract(keys)
        return httpx.Response(200)


async def _ended(handle: WebhooksHandle, receivers: HangingReceivers, tenant: str) -> str:
    """A job of `tenant` watched, then ended `completed`; its delivery's webhook-id."""
    job = _queued(tenant)
    delivery = await handle.watch(job)
    assert delivery is not None
    receivers.tenant_of[delivery.event_id] = tenant
    handle.ended(delivery, dataclasses.replace(job, status="completed"))
    return delivery.event_id


async def test_on_trios_clock_a_hanging_receiver_holds_only_its_own_lanes(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    """The default policy (10 s attempts). Alice has her own hanging URL; carol, dave and
    erin share one that hangs (the server's); bob's answers. They end 48 jobs each, bob
    one after them: his goes at once. No tenant has more than its lanes at once, the
    shared URL no more than its own, and every hanging delivery is attempted and then
    retried."""
    store = await _store(nursery)
    alice, shared, bob = "http://alice.test/hook", "http://shared.test/hook", "http://bob.test/hook"
    urls = {"alice": alice, "carol": shared, "dave": shared, "erin": shared, "bob": bob}
    receivers = HangingReceivers({alice, shared})
    sender = WebhookSender(
        store,
        lambda tenant: WebhookTarget(urls[tenant], KEY),
        WebhookPolicy(),
        transport=httpx.MockTransport(receivers),
    )
    handle = await nursery.start(sender.run)
    hanging = [await _ended(handle, receivers, t) for _ in range(48) for t in urls if t != "bob"]
    await trio.sleep(1.0)  # the first attempts hang now
    bobs_end = trio.current_time()
    bobs = await _ended(handle, receivers, "bob")
    await trio.sleep(1.0)
    (bobs_post,) = [p for p in receivers.posts if p[3] == bobs]
    assert bobs_post[0] - bobs_end < 0.1  # not one of the 10 s attempts waited for
    await trio.sleep(600.0)
    tries = Counter(p[3] for p in receivers.posts if p[3] != bobs)
    assert set(tries) == set(hanging)  # every one attempted ...
    assert min(tries.values()) >= 2  # ... and retried
    assert receivers.most[alice] == receivers.most["alice"] == PER_TENANT
    assert receivers.most[shared] == PER_TARGET
    assert max(receivers.most[t] for t in ("carol", "dave", "erin")) == PER_TENANT


async def test_a_jobs_end_racing_a_recheck_of_it_is_sent_once(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recheck of a running job's delivery is claimed; before it reads the response, the
    job ends and its end is announced (a claim of its own); the recheck then reads the
    end too, and leaves it to that claim: one post."""
    store = await _store(nursery)
    job = _queued("a")
    await store.put(dataclasses.replace(job, status="in_progress"))
    reading, finished = trio.Event(), trio.Event()
    read = store.get

    async def get_once_finished(response_id: str) -> object:
        reading.set()
        await finished.wait()
        return await read(response_id)

    monkeypatch.setattr(store, "get", get_once_finished)
    receivers = HangingReceivers(set())
    sender = WebhookSender(
        store,
        lambda _: WebhookTarget("http://a.test/hook", KEY),
        POLICY,
        transport=httpx.MockTransport(receivers),
    )
    handle = await nursery.start(sender.run)
    delivery = await handle.watch(job)
    assert delivery is not None
    receivers.tenant_of[delivery.event_id] = "a"
    await reading.wait()  # rechecked after `watch_secs`: claimed, reading
    ended = dataclasses.replace(job, status="completed")
    await store.put(ended)
    handle.ended(delivery, ended)
    await trio.sleep(1.0)
    assert len(receivers.posts) == 1  # the end's own claim
    finished.set()
    await trio.sleep(60.0)
    assert len(receivers.posts) == 1
    assert await store.deliveries.claim(10, 1.0) == ()  # delivered: nothing kept
