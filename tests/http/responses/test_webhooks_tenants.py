"""Webhooks of several tenants (keys with their own receivers) from an in-process server
(fake engine) to real receivers on 127.0.0.1: one tenant's hanging receiver never delays
another tenant's announcements, and its pending deliveries cannot take the store's whole
cap from the others."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import trio
from openai import OpenAI

import mlxcel.store.redis.deliveries as redis_deliveries
import mlxcel.store.sqlite.deliveries as sqlite_deliveries
from mlxcel.store import deliveries as deliveries_module

from support import FakeServer, KeysFile, StartServer, in_thread
from webhook_receiver import HANG, SECRET, Receiver, receiver, unwrap

TIMEOUT_SECS = 2.0
"""One attempt's timeout here: a hanging receiver holds each attempt this long."""


def _keys(keys_file: KeysFile, alice: Receiver, bob: Receiver) -> Path:
    return keys_file(
        f"alice:sk-alice webhook_url={alice.url} webhook_secret={SECRET}\n"
        f"bob:sk-bob webhook_url={bob.url} webhook_secret={SECRET}\n"
    )


async def _background(client: OpenAI, text: str) -> str:
    created = await in_thread(
        client.responses.create, model="fake-model", input=text, background=True
    )
    return str(created.id)


async def _final(client: OpenAI, response_id: str) -> str:
    with trio.fail_after(20):
        while True:
            got = await in_thread(client.responses.retrieve, response_id)
            if got.status not in ("queued", "in_progress"):
                return str(got.status)
            await trio.sleep(0.02)


async def _metric(server: FakeServer, name: str) -> float:
    async with httpx.AsyncClient(base_url=server.url) as http:
        got = await http.get("/metrics", headers={"authorization": "Bearer sk-bob"})
        assert got.status_code == 200
        text = got.text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


async def _still_serving(server: FakeServer, client: OpenAI) -> None:
    """`/health` answers and an ordinary request completes."""
    async with httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.get("/health")).status_code == 200
    ordinary = await in_thread(client.responses.create, model="fake-model", input="echo: ok")
    assert ordinary.output_text == "ok"


async def test_a_hanging_receiver_never_delays_another_tenants_webhook(
    start_fake_server: StartServer, keys_file: KeysFile
) -> None:
    """48 of alice's jobs end at a receiver that never answers; bob's job ends after them
    and is announced at once, not after alice's attempts time out; alice's are still
    attempted and retried."""
    with receiver([HANG] * 1000) as alices, receiver() as bobs:
        server = await start_fake_server(
            api_key_file=_keys(keys_file, alices, bobs),
            webhook_timeout_secs=TIMEOUT_SECS,
            webhook_backoff_secs=0.05,
        )
        alice, bob = server.client("sk-alice"), server.client("sk-bob")
        ids = [await _background(alice, f"echo: alice {n}") for n in range(48)]
        for response_id in ids:
            assert await _final(alice, response_id) == "completed"
        await in_thread(alices.wait_for, 1)  # her receiver holds attempts now
        bobs_id = await _background(bob, "echo: bob")
        assert await _final(bob, bobs_id) == "completed"
        ended = time.monotonic()
        (hit,) = await in_thread(bobs.wait_for, 1)
        # Well within one attempt's timeout: bob waits for none of alice's attempts
        # (behind a shared batch he waited for three of them, 6 s).
        assert hit.at - ended < TIMEOUT_SECS * 0.75
        assert unwrap(hit).data.id == bobs_id
        # Alice's deliveries go on, bounded: each one is attempted, then retried.
        hits = await in_thread(alices.wait_for, 50, secs=60)
        seen = Counter(h.headers["webhook-id"] for h in hits)
        assert {unwrap(h).data.id for h in hits} == set(ids)
        assert max(seen.values()) == 2  # a retry, under the same webhook-id
        assert len(bobs.hits) == 1
        await _still_serving(server, bob)


@pytest.mark.parametrize("fake_store", ["memory", "sqlite", "redis"])
async def test_a_tenant_over_its_share_of_pending_deliveries_leaves_room_for_others(
    start_fake_server: StartServer, keys_file: KeysFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store keeps 6 deliveries here, a key 3: alice's receiver hangs and she ends 6
    jobs; each response is still created and completes, 3 of them unannounced (logged
    and counted); bob's job is announced."""
    for module in (deliveries_module, sqlite_deliveries, redis_deliveries):
        monkeypatch.setattr(module, "MAX_PENDING", 6)
    with receiver([HANG] * 1000) as alices, receiver() as bobs:
        server = await start_fake_server(
            api_key_file=_keys(keys_file, alices, bobs),
            webhook_timeout_secs=60.0,  # her kept deliveries stay pending
            webhook_max_pending_per_key=3,
        )
        alice, bob = server.client("sk-alice"), server.client("sk-bob")
        ids = [await _background(alice, f"echo: alice {n}") for n in range(6)]
        for response_id in ids:
            assert await _final(alice, response_id) == "completed"
        refused = 'mlxcel_webhook_refused_total{reason="key_full"}'
        assert await _metric(server, refused) == 3
        bobs_id = await _background(bob, "echo: bob")
        (hit,) = await in_thread(bobs.wait_for, 1)
        assert unwrap(hit).data.id == bobs_id
        assert await _metric(server, 'mlxcel_webhook_refused_total{reason="store_full"}') == 0
        await _still_serving(server, bob)
