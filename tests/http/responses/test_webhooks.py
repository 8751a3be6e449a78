"""Webhooks from an in-process server (fake engine) to a real receiver on 127.0.0.1: each
way a background response ends is announced once, signed so the openai SDK's
`webhooks.unwrap` verifies it; failed attempts are retried under one `webhook-id`; a
hanging or unreachable receiver costs attempts, never the server; a key's own webhook
from the keys file takes its tenant's announcements."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import httpx
import openai
import pytest
import trio

from mlxcel.model.fake import FakeEngine

from support import LONG, FakeServer, KeysFile, StartServer, in_thread
from webhook_receiver import HANG, SECRET, Receiver, receiver, unwrap

FAST = {
    "webhook_secret": SECRET,
    "webhook_backoff_secs": 0.05,
    "webhook_timeout_secs": 1.0,
    "webhook_max_attempts": 4,
}


@pytest.fixture
def hook() -> Iterator[Receiver]:
    with receiver() as r:
        yield r


async def _background(server: FakeServer, text: str, **extra: object) -> str:
    client = server.client()
    created = await in_thread(
        client.responses.create, model="fake-model", input=text, background=True, **extra
    )
    return str(created.id)


async def _final(server: FakeServer, response_id: str) -> str:
    client = server.client()
    with trio.fail_after(20):
        while True:
            got = await in_thread(client.responses.retrieve, response_id)
            if got.status not in ("queued", "in_progress"):
                return str(got.status)
            await trio.sleep(0.02)


async def _metric(server: FakeServer, name: str) -> float:
    async with httpx.AsyncClient(base_url=server.url) as http:
        text = (await http.get("/metrics")).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


async def test_each_end_is_announced_once_and_verifies_with_the_sdk(
    start_fake_server: StartServer, hook: Receiver
) -> None:
    engine = FakeEngine(step_delay=0.002, fail_on="boom")
    server = await start_fake_server(engine, webhook_url=hook.url, **FAST)
    failed = await _background(server, "echo: a boom here")
    # An engine failure fails every sequence in the batch: the others run after it.
    assert await _final(server, failed) == "failed"
    completed = await _background(server, "echo: hello there")
    incomplete = await _background(server, LONG, max_output_tokens=16)
    engine.hold(on="w0")
    cancelled = await _background(server, LONG)
    await in_thread(server.client().responses.cancel, cancelled)
    engine.release()
    expected = {
        completed: "response.completed",
        failed: "response.failed",
        incomplete: "response.incomplete",
        cancelled: "response.cancelled",
    }
    for response_id in expected:
        await _final(server, response_id)
    hits = await in_thread(hook.wait_for, 4)
    await trio.sleep(0.3)
    assert len(hook.hits) == 4  # once each, nothing more
    seen = {}
    for hit in hits:
        event = unwrap(hit)
        assert event.object == "event"
        assert event.id.startswith("evt_")
        assert hit.headers["webhook-id"] == event.id
        assert hit.headers["content-type"] == "application/json"
        seen[event.data.id] = event.type
    assert seen == expected
    assert await _metric(server, 'mlxcel_webhook_deliveries_total{result="succeeded"}') == 4


async def test_a_tampered_body_or_an_old_timestamp_fails_verification(
    start_fake_server: StartServer, hook: Receiver
) -> None:
    server = await start_fake_server(webhook_url=hook.url, **FAST)
    response_id = await _background(server, "echo: sign me")
    (hit,) = await in_thread(hook.wait_for, 1)
    body = json.loads(hit.body)
    assert body["data"] == {"id": response_id}
    assert isinstance(body["created_at"], int)
    tampered = hit.body.replace(response_id.encode(), b"resp_someone_else")
    with pytest.raises(openai.InvalidWebhookSignatureError):
        unwrap(type(hit)(hit.headers, tampered, hit.at))
    old = dict(
        hit.headers, **{"webhook-timestamp": str(int(hit.headers["webhook-timestamp"]) - 600)}
    )
    with pytest.raises(openai.InvalidWebhookSignatureError):
        unwrap(type(hit)(old, hit.body, hit.at))
    other = "whsec_" + base64.b64encode(b"another secret of 32 bytes......").decode()
    with pytest.raises(openai.InvalidWebhookSignatureError):
        unwrap(hit, other)


async def test_two_500s_then_a_200_are_three_attempts_with_one_webhook_id(
    start_fake_server: StartServer,
) -> None:
    with receiver([500, 500, 200]) as hook:
        server = await start_fake_server(webhook_url=hook.url, **FAST)
        response_id = await _background(server, "echo: retry me")
        hits = await in_thread(hook.wait_for, 3)
        await trio.sleep(0.5)
        assert len(hook.hits) == 3
    assert len({h.headers["webhook-id"] for h in hits}) == 1
    assert len({h.body for h in hits}) == 1  # the same event each time
    assert all(unwrap(h).data.id == response_id for h in hits)  # each attempt signed afresh
    # Backing off: at least half of 0.05 s after the first failure, of 0.1 s after the second.
    assert hits[1].at - hits[0].at >= 0.025
    assert hits[2].at - hits[1].at >= 0.05
    assert await _metric(server, "mlxcel_webhook_attempts_total") == 3


async def test_a_receiver_that_never_succeeds_is_given_up_after_the_limit(
    start_fake_server: StartServer,
) -> None:
    with receiver([503] * 10) as hook:
        server = await start_fake_server(webhook_url=hook.url, **FAST)
        await _background(server, "echo: nobody home")
        await in_thread(hook.wait_for, 4)
        await trio.sleep(1.0)
        assert len(hook.hits) == 4  # --webhook-max-attempts
    assert await _metric(server, 'mlxcel_webhook_deliveries_total{result="failed"}') == 1


async def test_a_hanging_receiver_times_out_and_is_retried(
    start_fake_server: StartServer,
) -> None:
    with receiver([HANG, 200]) as hook:
        server = await start_fake_server(webhook_url=hook.url, **FAST)
        await _background(server, "echo: slow receiver")
        first, second = await in_thread(hook.wait_for, 2)
        assert second.at - first.at >= 0.9  # the attempt's timeout, 1 s
        assert second.headers["webhook-id"] == first.headers["webhook-id"]
        unwrap(second)
        # Meanwhile the server served on: another job ends and is announced.
        await _background(server, "echo: meanwhile")
        await in_thread(hook.wait_for, 3)


async def test_an_unreachable_url_costs_attempts_not_the_server(
    start_fake_server: StartServer,
) -> None:
    with receiver() as gone:
        url = gone.url  # a port nothing listens on once it is closed
    server = await start_fake_server(webhook_url=url, **FAST)
    response_id = await _background(server, "echo: into the void")
    assert await _final(server, response_id) == "completed"
    for _ in range(200):  # given up after its attempts, within seconds
        if await _metric(server, 'mlxcel_webhook_deliveries_total{result="failed"}') >= 1:
            break
        await trio.sleep(0.05)
    assert await _metric(server, "mlxcel_webhook_attempts_total") == 4
    async with httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.get("/health")).status_code == 200
    ordinary = await in_thread(
        server.client().responses.create, model="fake-model", input="echo: ok"
    )
    assert ordinary.output_text == "ok"


async def test_a_keys_own_webhook_takes_its_tenants_ends(
    start_fake_server: StartServer, keys_file: KeysFile, hook: Receiver
) -> None:
    own_secret = "whsec_" + base64.b64encode(b"carol's own secret of 32 bytes..").decode()
    with receiver() as own:
        keys = keys_file(
            f"carol:sk-carol webhook_url={own.url} webhook_secret={own_secret}\nbob:sk-bob\n"
        )
        server = await start_fake_server(api_key_file=keys, webhook_url=hook.url, **FAST)
        carol = await in_thread(
            server.client("sk-carol").responses.create,
            model="fake-model",
            input="echo: carol's",
            background=True,
        )
        bob = await in_thread(
            server.client("sk-bob").responses.create,
            model="fake-model",
            input="echo: bob's",
            background=True,
        )
        (carols,) = await in_thread(own.wait_for, 1)
        (bobs,) = await in_thread(hook.wait_for, 1)
        await trio.sleep(0.3)
        assert len(own.hits) == len(hook.hits) == 1
    assert unwrap(carols, own_secret).data.id == carol.id
    assert unwrap(bobs).data.id == bob.id
    with pytest.raises(openai.InvalidWebhookSignatureError):
        unwrap(carols)  # signed with carol's secret, not the server's


async def test_a_request_cannot_name_a_webhook(
    start_fake_server: StartServer, hook: Receiver
) -> None:
    """A URL in a request (an unknown field, metadata) is never posted to: only the
    operator's is, and a server without one posts nothing."""
    body = {"model": "fake-model", "input": "echo: hi", "background": True}
    with receiver() as other:
        body |= {"webhook_url": other.url, "metadata": {"webhook_url": other.url}}
        configured = await start_fake_server(webhook_url=hook.url, **FAST)
        bare = await start_fake_server()
        ids = []
        for server in (configured, bare):
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
                r = await http.post("/v1/responses", json=body)
            assert r.status_code == 200
            ids.append(r.json()["id"])
            assert await _final(server, ids[-1]) == "completed"
        (hit,) = await in_thread(hook.wait_for, 1)
        await trio.sleep(0.5)
        assert other.hits == []
        assert len(hook.hits) == 1
    assert unwrap(hit).data.id == ids[0]


async def test_a_redirect_is_not_followed_to_a_url_nobody_configured(
    start_fake_server: StartServer,
) -> None:
    with receiver() as elsewhere, receiver([307, 302]) as hook:
        hook.location = elsewhere.url
        server = await start_fake_server(webhook_url=hook.url, **FAST)
        await _background(server, "echo: redirected")
        hits = await in_thread(hook.wait_for, 3)  # two refused redirects, then a 200
        await trio.sleep(0.3)
        assert elsewhere.hits == []
    assert len({h.headers["webhook-id"] for h in hits}) == 1
