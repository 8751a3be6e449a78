"""Hostile state: requests that aim at the store's own bookkeeping rather than at a
route's input, each on every store backend (memory, SQLite, a real Redis), over real
HTTP on the fake engine. Each test names what it proves and failed before its fix."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
import trio

from mlxcel.app import serve
from mlxcel.config import Settings
from mlxcel.generation import ModelNames
from mlxcel.model.fake import FakeEngine, fake_factory
from mlxcel.store import StoreLimits

from redis_server import RedisServer
from support import StartServer, read_until

REPEATS = 20_000
"""One client-chosen item id repeated this often in one input: reasoning items render to
nothing, so they pass every precheck of a large enough context window."""

KEYS = ("key-a", "key-b")
SHORT = "echo: " + "w " * 50


@pytest.fixture(params=["memory", "sqlite", "redis"])
def fake_store(request: pytest.FixtureRequest) -> str:
    """Every test here runs on every store backend."""
    return str(request.param)


def repeated_ids(text: str) -> list[dict[str, Any]]:
    same = {"type": "reasoning", "id": "rs_same", "summary": []}
    return [*([same] * REPEATS), {"role": "user", "content": f"echo: {text}"}]


async def create(http: httpx.AsyncClient, body: dict[str, Any], key: str = "") -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = await http.post("/v1/responses", json={"model": "fake-model", **body}, headers=headers)
    assert r.status_code == 200, r.text
    return dict(r.json())


async def test_deleting_and_evicting_a_record_repeating_one_id_is_linear(
    start_fake_server: StartServer, fake_store: str, request: pytest.FixtureRequest
) -> None:
    """Before: the item index kept one place per copy and rebuilt the id's list per copy
    (K = 12,000 froze the loop for 4.9 s; on Redis one script re-encoded a JSON list per
    item and blocked every replica). Now each (record, id) is indexed once."""
    server = await start_fake_server(
        context_length=4 * REPEATS, responses=StoreLimits(2, 268_435_456, 3600)
    )
    redis: RedisServer | None = None
    if fake_store == "redis":
        redis = request.getfixturevalue("redis_server")
        redis.call("CONFIG", "SET", "slowlog-log-slower-than", "50000")  # 50 ms
        redis.call("SLOWLOG", "RESET")
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            first = await create(http, {"input": repeated_ids("one")})
            seconds = await timed(lambda: http.delete(f"/v1/responses/{first['id']}"))
            assert seconds < 5, f"delete took {seconds:.2f} s"  # quadratic: ~15 s
            assert (await http.get(f"/v1/responses/{first['id']}")).status_code == 404
            # Eviction: the entry cap of 2 evicts the oldest at the third put.
            kept = [await create(http, {"input": repeated_ids(str(n))}) for n in range(2)]
            body = {"model": "fake-model", "input": "echo: x"}
            seconds = await timed(lambda: http.post("/v1/responses", json=body))
            assert seconds < 5, f"a put that evicts took {seconds:.2f} s"
            assert (await http.get(f"/v1/responses/{kept[0]['id']}")).status_code == 404
            assert (await http.get(f"/v1/responses/{kept[1]['id']}")).status_code == 200
            assert (await http.get("/health")).status_code == 200
        if redis is not None:
            assert redis.call("SLOWLOG", "LEN") == 0, redis.call("SLOWLOG", "GET", "3")
    finally:
        if redis is not None:
            redis.call("CONFIG", "SET", "slowlog-log-slower-than", "10000")


async def timed(work: Callable[[], Awaitable[httpx.Response]]) -> float:
    """Seconds `work()` took; it must answer 200."""
    started = time.monotonic()
    response = await work()
    assert response.status_code == 200, response.text
    return time.monotonic() - started


async def test_an_item_reference_resolves_among_the_asking_tenants_records_only(
    start_fake_server: StartServer,
) -> None:
    """Before: a reference took the newest record holding the id, then checked its
    tenant, so once another tenant stored an item with the same id the owner's reference
    answered 400 (telling it someone else used the id)."""
    server = await start_fake_server(api_keys=KEYS)
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        mine = {"type": "message", "id": "msg_chosen", "role": "user", "content": "echo: mine"}
        theirs = {**mine, "content": "echo: theirs"}
        await create(http, {"input": [mine]}, KEYS[0])
        await create(http, {"input": [theirs]}, KEYS[1])  # the same id, stored later
        reference = [{"type": "item_reference", "id": "msg_chosen"}]
        answer = await create(http, {"input": reference}, KEYS[0])
        assert answer["output"][0]["content"][0]["text"] == "mine"
        answer = await create(http, {"input": reference}, KEYS[1])
        assert answer["output"][0]["content"][0]["text"] == "theirs"


@pytest.mark.parametrize("fake_store", ["sqlite", "redis"])  # memory decodes nothing
async def test_references_into_one_big_record_decode_it_once(
    start_fake_server: StartServer, fake_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: each reference decoded (SQLite) or shipped (Redis) the whole record that
    holds it: 300 references into one 500 KB record cost 150 MB of decoding."""
    import mlxcel.store.redis.values as redis_backend
    import mlxcel.store.sqlite.backend as sqlite_backend

    decoded: list[int] = []
    module, name = (
        (sqlite_backend, "decode") if fake_store == "sqlite" else (redis_backend, "decode_response")
    )
    original = getattr(module, name)

    def counting(body: bytes) -> Any:
        decoded.append(len(body))
        return original(body)

    server = await start_fake_server(context_length=2_000_000)
    text = "w" * 1_600
    held = [
        {"type": "message", "id": f"msg_{n}", "role": "user", "content": text} for n in range(300)
    ]
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        await create(http, {"input": [*held, {"role": "user", "content": "echo: ok"}]})
        monkeypatch.setattr(module, name, counting)
        references = [{"type": "item_reference", "id": f"msg_{n}"} for n in range(300)]
        await create(http, {"input": [*references, {"role": "user", "content": "echo: ok"}]})
    big = [size for size in decoded if size > 400_000]
    assert len(big) == 1, decoded


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/chat/completions"])
async def test_a_request_whose_body_arrives_during_the_drain_gets_503(
    nursery: trio.Nursery, path: str
) -> None:
    """Before: its head passed the stopping guard, its body came after the drain began,
    and it was submitted, ran, and was cut by the backstop with no terminal event."""
    shutdown, stopped = trio.Event(), trio.Event()
    settings = Settings(port=0, shutdown_timeout_secs=5)
    factory = functools.partial(fake_factory, FakeEngine(step_delay=0.01))

    async def run(*, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        names = ModelNames("fake-model", "/models/fake")
        await serve(settings, factory, names, shutdown=shutdown, task_status=task_status)
        stopped.set()

    url = (await nursery.start(run))[0]
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:  # the model has loaded
        with trio.fail_after(30):
            while (await http.get("/health")).status_code != 200:  # noqa: ASYNC110
                await trio.sleep(0.05)
    host, port = url.removeprefix("http://").split(":")
    message = {"role": "user", "content": "echo: late"}
    body = json.dumps({"model": "fake-model", "input": [message], "messages": [message]})
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(head.encode())
        await trio.sleep(0.2)  # the guards have run; the route waits for the body
        shutdown.set()
        await trio.sleep(0.2)  # the drain has begun
        await stream.send_all(body.encode())
        answer = await read_until(stream, b"}}")
    assert answer.startswith(b"HTTP/1.1 503"), answer
    assert b"server_shutting_down" in answer
    with trio.fail_after(10):
        await stopped.wait()


async def test_one_page_of_a_huge_responses_input_items_renders_one_item(
    start_fake_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: `input_items?limit=1` of a 90,000-item response wrote every item's JSON
    before cutting the page (0.32 s on the event loop)."""
    import mlxcel.http.stored as stored

    server = await start_fake_server(context_length=100_000)
    items = [{"type": "reasoning", "id": f"rs_{n}", "summary": []} for n in range(90_000)]
    rendered: list[str] = []

    def counting(item: Any) -> dict[str, Any]:
        rendered.append(item.id)
        return original(item)

    original = stored.item_json
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
        body = {"input": [*items, {"role": "user", "content": "echo: ok"}]}
        created = await create(http, body)
        monkeypatch.setattr(stored, "item_json", counting)
        path = f"/v1/responses/{created['id']}/input_items"
        page = (await http.get(path, params={"limit": 1, "order": "asc"})).json()
        assert [item["id"] for item in page["data"]] == ["rs_0"]
        assert page["has_more"] is True
        page = (await http.get(path, params={"limit": 2, "after": "rs_89998"})).json()
        assert [item["id"] for item in page["data"]] == ["rs_89997", "rs_89996"]
        retrieved = (await http.get(f"/v1/responses/{created['id']}")).json()
        assert len(retrieved["output"]) == 1
    assert rendered == ["rs_0", "rs_89997", "rs_89996"]


async def burst(urls: list[str], requests: int) -> list[int]:
    """`requests` concurrent responses of key-a spread over `urls`: each completed one's
    tokens (refused ones count none)."""
    spent: list[int] = []
    body = {"model": "fake-model", "input": "echo: " + "w " * 60, "max_output_tokens": 80}

    async def one(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            r = await http.post(
                "/v1/responses", json=body, headers={"Authorization": "Bearer key-a"}
            )
        if r.status_code == 200:
            spent.append(r.json()["usage"]["total_tokens"])
        else:
            assert r.status_code == 429, r.text

    async with trio.open_nursery() as nursery:
        for n in range(requests):
            nursery.start_soon(one, urls[n % len(urls)])
    return spent


async def test_a_burst_spends_at_most_the_daily_quota_plus_one_request(
    start_fake_server: StartServer,
) -> None:
    """Before: tokens were read at admission and charged at the end, so 30 concurrent
    requests of a `daily=1000` key all ran (90,780 tokens spent)."""
    engine = FakeEngine(step_delay=0.005)
    server = await start_fake_server(engine, api_keys=KEYS, daily_token_quota=1000, parallel=4)
    spent = await burst([server.url], 30)
    assert spent
    assert sum(spent) <= 1000 + max(spent), spent


@pytest.mark.parametrize("fake_store", ["redis"])
async def test_a_burst_over_two_replicas_spends_at_most_the_quota_plus_one_request(
    start_fake_server: StartServer, redis_server: RedisServer
) -> None:
    shared = {"store": redis_server.url, "redis_key_prefix": f"burst-{time.time_ns()}"}
    replicas = [
        await start_fake_server(
            FakeEngine(step_delay=0.005), api_keys=KEYS, daily_token_quota=1000, **shared
        )
        for _ in range(2)
    ]
    spent = await burst([replica.url for replica in replicas], 30)
    assert spent
    assert sum(spent) <= 1000 + max(spent), spent


async def test_requests_that_hang_up_at_once_return_their_reservations(
    start_fake_server: StartServer,
) -> None:
    """Each request reserves its input plus `max_output_tokens` before it runs; one whose
    client hangs up at once (running, or still waiting in the line) must give back what
    it did not spend, or ten of them would hold the key's whole quota."""
    server = await start_fake_server(
        FakeEngine(step_delay=0.001),
        api_keys=KEYS,
        rate_limit_tpm=100_000,
        parallel=1,
        max_queue_depth=4,
    )
    host, port = server.url.removeprefix("http://").split(":")
    for n in range(10):
        body = json.dumps(
            {
                "model": "fake-model",
                "input": SHORT,
                "max_output_tokens": 5_000,
                "stream": n % 2 == 0,
            }
        )
        head = (
            f"POST /v1/responses HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {KEYS[0]}\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        stream = await trio.open_tcp_stream(host, int(port))
        await stream.send_all(head.encode() + body.encode())
        await trio.sleep(n % 3 * 0.005)  # hang up at slightly different moments
        await stream.aclose()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        with trio.fail_after(30):
            while True:  # every abandoned response has ended and settled
                ask = {"model": "fake-model", "input": "echo: hi", "max_output_tokens": 4}
                r = await http.post(
                    "/v1/responses", json=ask, headers={"Authorization": f"Bearer {KEYS[0]}"}
                )
                assert r.status_code in (200, 503), r.text
                stats = (await http.get("/health")).json()["slots"]
                if r.status_code == 200 and stats["busy"] == 0 and stats["queued"] == 0:
                    break
                await trio.sleep(0.05)
            after = await http.post(
                "/v1/responses", json=ask, headers={"Authorization": f"Bearer {KEYS[0]}"}
            )
    assert after.status_code == 200, after.text
    remaining = int(after.headers["x-ratelimit-remaining-tokens"])
    # Ten reservations of over 5,000 tokens each would leave under 50,000.
    assert remaining > 100_000 - 10 * 1_000, remaining
