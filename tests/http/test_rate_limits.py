"""Per-key rate limits and quotas over real HTTP: the `openai` SDK sees the 429s, httpx
reads the headers. In-process servers run on Trio's mock clock, frozen unless a test
jumps it, so no window ends by itself mid-test and waiting out a window takes no time."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import trio
from openai import OpenAI

from mlxcel.http.rate_limits import duration

from redis_server import RedisServer
from server_process import ServerProcesses
from support import FakeServer, KeysFile, StartServer, in_thread

KEYS = ("key-a", "key-b")
MODEL = "fake-model"
ASK = {"model": MODEL, "input": "echo: hello there", "max_output_tokens": 16}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def sdk() -> Iterator[dict[str, OpenAI]]:
    """The SDK clients a test makes, by key, closed when it ends."""
    made: dict[str, OpenAI] = {}
    yield made
    for client in made.values():
        client.close()


def client(made: dict[str, OpenAI], server: FakeServer, key: str) -> OpenAI:
    made[key] = OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
    return made[key]


async def post(
    http: httpx.AsyncClient, key: str, path: str = "/v1/responses", **body: Any
) -> httpx.Response:
    return await http.post(path, json=body or ASK, headers=auth(key))


async def test_the_request_limit_refuses_the_next_request_until_the_minute_ends(
    start_fake_server: StartServer, mock_clock: trio.testing.MockClock, sdk: dict[str, OpenAI]
) -> None:
    server = await start_fake_server(api_keys=KEYS, rate_limit_rpm=3)
    a = client(sdk, server, "key-a")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        remaining = []
        for _ in range(3):
            raw = await in_thread(a.responses.with_raw_response.create, **ASK)
            assert raw.parse().status == "completed"
            assert raw.headers["x-ratelimit-limit-requests"] == "3"
            remaining.append(raw.headers["x-ratelimit-remaining-requests"])
            assert raw.headers["x-ratelimit-reset-requests"].endswith("s")
            assert "x-ratelimit-limit-tokens" not in raw.headers  # that limit is off
        assert remaining == ["2", "1", "0"]

        with pytest.raises(openai.RateLimitError) as refused:
            await in_thread(a.responses.create, **ASK)
        assert refused.value.code == "rate_limit_exceeded"
        error = refused.value.body
        assert isinstance(error, dict)
        assert error["type"] == "requests"
        assert "requests per min" in error["message"]
        headers = refused.value.response.headers
        assert headers["x-ratelimit-remaining-requests"] == "0"
        retry_after = int(headers["retry-after"])
        assert 1 <= retry_after <= 60
        # The reset header says the same moment, in OpenAI's duration format.
        assert math.ceil(_secs(headers["x-ratelimit-reset-requests"])) == retry_after

        # Key B has its own count.
        b = await post(http, "key-b")
        assert b.status_code == 200
        assert b.headers["x-ratelimit-remaining-requests"] == "2"

        # Just before the window ends, still refused; once it has, admitted again.
        almost = _secs(headers["x-ratelimit-reset-requests"]) - 0.01
        mock_clock.jump(almost)
        assert (await post(http, "key-a")).status_code == 429
        mock_clock.jump(retry_after - almost)
        again = await post(http, "key-a")
        assert again.status_code == 200
        assert again.headers["x-ratelimit-remaining-requests"] == "2"


async def test_every_generating_route_counts_and_says_so(
    start_fake_server: StartServer, mock_clock: trio.testing.MockClock
) -> None:
    server = await start_fake_server(api_keys=KEYS, rate_limit_rpm=5)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "echo: hi"}]}
    text = {"model": MODEL, "prompt": "echo: hi", "max_tokens": 8}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        seen = [
            await post(http, "key-a", "/v1/chat/completions", **chat),
            await post(http, "key-a", "/v1/completions", **text),
            await post(http, "key-a", "/responses"),  # the same route without /v1
            await post(http, "key-a", **{**ASK, "stream": True}),
        ]
        assert [r.status_code for r in seen] == [200, 200, 200, 200]
        assert seen[-1].headers["content-type"].startswith("text/event-stream")
        assert "response.completed" in seen[-1].text
        remaining = [r.headers["x-ratelimit-remaining-requests"] for r in seen]
        assert remaining == ["4", "3", "2", "1"]
        # Routes that generate nothing are neither counted nor labelled.
        models = await http.get("/v1/models", headers=auth("key-a"))
        assert "x-ratelimit-limit-requests" not in models.headers
        assert (await post(http, "key-a", "/v1/chat/completions", **chat)).status_code == 200
        refused = await post(http, "key-a", "/v1/completions", **text)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"


async def test_the_token_limit_counts_what_responses_spent(
    start_fake_server: StartServer, mock_clock: trio.testing.MockClock, sdk: dict[str, OpenAI]
) -> None:
    server = await start_fake_server(api_keys=KEYS, rate_limit_tpm=100)
    a = client(sdk, server, "key-a")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        first = await post(http, "key-a")
        assert first.status_code == 200
        assert first.headers["x-ratelimit-limit-tokens"] == "100"
        assert first.headers["x-ratelimit-remaining-tokens"] == "100"  # nothing spent before
        spent = first.json()["usage"]["total_tokens"]
        assert 0 < spent < 50
        second = await post(http, "key-a")
        assert second.headers["x-ratelimit-remaining-tokens"] == str(100 - spent)
        spent += second.json()["usage"]["total_tokens"]
        # A stream's tokens count too, charged before its last event.
        stream = await in_thread(
            lambda: list(a.responses.create(**{**ASK, "input": "echo: " + "w " * 40}, stream=True))
        )
        usage = stream[-1].response.usage
        assert usage is not None
        spent += usage.total_tokens
        assert spent >= 100
        with pytest.raises(openai.RateLimitError) as refused:
            await in_thread(a.responses.create, **ASK)
        assert refused.value.code == "rate_limit_exceeded"
        assert isinstance(refused.value.body, dict)
        assert refused.value.body["type"] == "tokens"
        headers = refused.value.response.headers
        assert headers["x-ratelimit-remaining-tokens"] == "0"
        assert (await post(http, "key-b")).status_code == 200  # B spent nothing
        mock_clock.jump(int(headers["retry-after"]))
        assert (await post(http, "key-a")).status_code == 200


async def test_a_background_job_charges_its_tokens_when_it_ends(
    start_fake_server: StartServer, mock_clock: trio.testing.MockClock
) -> None:
    server = await start_fake_server(api_keys=KEYS, rate_limit_tpm=30)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        long = "echo: " + "w " * 40
        queued = await post(http, "key-a", **{**ASK, "input": long, "background": True})
        assert queued.status_code == 200
        response_id = queued.json()["id"]
        for _ in range(2000):  # the clock stands still: real time passes off the loop
            polled = await http.get(f"/v1/responses/{response_id}", headers=auth("key-a"))
            if polled.json()["status"] not in ("queued", "in_progress"):
                break
            await trio.to_thread.run_sync(time.sleep, 0.01)
        assert polled.json()["status"] == "incomplete"  # at its max_output_tokens
        refused = await post(http, "key-a")
        assert refused.status_code == 429
        assert refused.json()["error"]["type"] == "tokens"


async def test_a_compaction_counts_as_a_request_and_spends_its_summarys_tokens(
    start_fake_server: StartServer, mock_clock: trio.testing.MockClock, sdk: dict[str, OpenAI]
) -> None:
    server = await start_fake_server(api_keys=KEYS, rate_limit_rpm=5, rate_limit_tpm=10_000)
    a = client(sdk, server, "key-a")
    turns = [{"role": "user", "content": f"turn {n}: " + "lorem ipsum " * 15} for n in range(6)]
    history = [*turns, {"role": "user", "content": "echo: And now?"}]
    raw = await in_thread(
        a.responses.with_raw_response.compact,
        model=MODEL,
        input=history,
    )
    usage = raw.parse().usage
    assert raw.headers["x-ratelimit-remaining-requests"] == "4"
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        after = await post(http, "key-a")
    assert after.headers["x-ratelimit-remaining-requests"] == "3"
    assert after.headers["x-ratelimit-remaining-tokens"] == str(10_000 - usage.total_tokens)


async def test_a_spent_daily_quota_is_insufficient_quota_until_midnight_utc(
    start_fake_server: StartServer, mock_clock: trio.testing.MockClock, sdk: dict[str, OpenAI]
) -> None:
    server = await start_fake_server(api_keys=KEYS, daily_token_quota=20)
    a = client(sdk, server, "key-a")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        first = await post(http, "key-a", **{**ASK, "input": "echo: " + "w " * 30})
        assert first.status_code == 200
        assert first.json()["usage"]["total_tokens"] >= 20
    with pytest.raises(openai.RateLimitError) as refused:
        await in_thread(a.responses.create, **ASK)
    assert refused.value.code == "insufficient_user_quota"
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["type"] == "insufficient_quota"
    retry_after = int(refused.value.response.headers["retry-after"])
    to_midnight = 86_400 - time.time() % 86_400
    off = abs(retry_after - to_midnight)
    assert min(off, 86_400 - off) < 120  # the fake clock stood still meanwhile
    # Until the day's end it is still spent; then it is renewed.
    mock_clock.jump(retry_after - 1)
    with pytest.raises(openai.RateLimitError):
        await in_thread(a.responses.create, **ASK)
    mock_clock.jump(1)
    assert (await in_thread(a.responses.create, **ASK)).status == "completed"


async def test_no_limits_when_they_are_off(
    start_fake_server: StartServer, mock_clock: trio.testing.MockClock
) -> None:
    server = await start_fake_server(api_keys=KEYS)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        for _ in range(8):
            answer = await post(http, "key-a")
            assert answer.status_code == 200
            assert not [h for h in answer.headers if h.startswith("x-ratelimit")]


async def test_without_keys_every_request_shares_the_one_limit(
    start_fake_server: StartServer, mock_clock: trio.testing.MockClock
) -> None:
    server = await start_fake_server(rate_limit_rpm=2)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        statuses = [(await http.post("/v1/responses", json=ASK)).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]


async def test_a_key_files_own_limits_override_the_flags(
    start_fake_server: StartServer, mock_clock: trio.testing.MockClock, keys_file: KeysFile
) -> None:
    keys = keys_file("vip:sk-vip rpm=3\nfree:sk-free\nnone:sk-none rpm=0\n")
    server = await start_fake_server(api_key_file=keys, rate_limit_rpm=1)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        vip = [(await post(http, "sk-vip")).status_code for _ in range(4)]
        free = [(await post(http, "sk-free")).status_code for _ in range(2)]
        unlimited = [await post(http, "sk-none") for _ in range(3)]
    assert vip == [200, 200, 200, 429]  # its own 3 a minute
    assert free == [200, 429]  # the flag's 1 a minute
    assert [r.status_code for r in unlimited] == [200, 200, 200]  # rpm=0: off for that key
    assert "x-ratelimit-limit-requests" not in unlimited[0].headers


def test_replicas_on_one_redis_share_each_keys_limit(
    servers: ServerProcesses, redis_server: RedisServer, redis_prefix: str
) -> None:
    """Two server processes on one Redis: a key's requests count together wherever they
    land, and each key keeps its own count."""
    flags = ("--store", redis_server.url, "--redis-key-prefix", redis_prefix)
    flags += ("--api-key", ",".join(KEYS), "--rate-limit-rpm", "3")
    one, two = servers.start_replicas(2, *flags)
    left = 60 - time.time() % 60
    if left < 10:  # the requests below must fall in one minute of the wall clock
        time.sleep(left + 0.05)
    with one.http() as h1, two.http() as h2:
        admitted = [h.post("/v1/responses", json=ASK, headers=auth("key-a")) for h in (h1, h2, h1)]
        assert [r.status_code for r in admitted] == [200, 200, 200]
        assert [r.headers["x-ratelimit-remaining-requests"] for r in admitted] == ["2", "1", "0"]
        other = h1.post("/v1/responses", json=ASK, headers=auth("key-b"))
        assert other.status_code == 200
        assert other.headers["x-ratelimit-remaining-requests"] == "2"
    sdk = OpenAI(base_url=f"{two.url}/v1", api_key="key-a", max_retries=0)
    with sdk, pytest.raises(openai.RateLimitError) as refused:
        sdk.responses.create(**ASK)
    assert refused.value.code == "rate_limit_exceeded"
    assert 1 <= int(refused.value.response.headers["retry-after"]) <= 60


@pytest.mark.parametrize(
    ("secs", "shown"),
    [
        (0.02, "20ms"),
        (0.0001, "1ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (59.9986, "59.999s"),
        (59.9996, "1m0s"),  # rounded up: never earlier than the reset
        (360, "6m0s"),
        (3723, "1h2m3s"),
        (86_399.5, "23h59m59.5s"),
    ],
)
def test_durations_are_written_as_openai_writes_them(secs: float, shown: str) -> None:
    assert duration(secs) == shown
    assert _secs(shown) == pytest.approx(secs, abs=0.001)


def _secs(duration: str) -> float:
    """OpenAI's duration format (`20ms`, `1.5s`, `6m0s`, `1h2m3s`) in seconds."""
    if duration.endswith("ms"):
        return int(duration[:-2]) / 1000
    total, number = 0.0, ""
    for char in duration:
        if char in "hms":
            total += float(number) * {"h": 3600, "m": 60, "s": 1}[char]
            number = ""
        else:
            number += char
    return total


async def test_an_automatic_compaction_charges_its_summarys_tokens_to_the_key(
    start_fake_server: StartServer, mock_clock: trio.testing.MockClock
) -> None:
    """`context_management` reads the whole history in the key's slot: the summary's
    tokens count, not only the final answer's (158 charged where /responses/compact
    charged 48,718 for the same history)."""
    server = await start_fake_server(api_keys=KEYS, rate_limit_tpm=100_000)
    turns = [{"role": "user", "content": f"turn {n}: " + "lorem ipsum " * 15} for n in range(6)]
    body = {
        "model": MODEL,
        "input": [*turns, {"role": "user", "content": "echo: And now?"}],
        "context_management": [{"type": "compaction", "compact_threshold": 200}],
    }
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        managed = await post(http, "key-a", **body)
        assert managed.status_code == 200, managed.text
        assert managed.json()["output"][0]["type"] == "compaction"
        answered = managed.json()["usage"]["total_tokens"]
        after = await post(http, "key-a")
    spent = 100_000 - int(after.headers["x-ratelimit-remaining-tokens"])
    summary_read = 200  # the summary prompt holds the whole history, over the threshold
    assert spent >= answered + summary_read, (spent, answered)


async def test_counting_input_tokens_counts_against_the_request_rate(
    start_fake_server: StartServer, mock_clock: trio.testing.MockClock, sdk: dict[str, OpenAI]
) -> None:
    """`/v1/responses/input_tokens` renders a whole input (and cuts it to the window under
    `truncation: "auto"`): it is a request against the key's rate like a create, with no
    tokens charged."""
    server = await start_fake_server(api_keys=KEYS, rate_limit_rpm=1, rate_limit_tpm=1_000)
    a = client(sdk, server, "key-a")
    body = {"model": MODEL, "input": "echo: hello there", "truncation": "auto"}
    counted = await in_thread(a.responses.input_tokens.count, **body)
    assert counted.input_tokens > 0
    with pytest.raises(openai.RateLimitError) as refused:
        await in_thread(a.responses.input_tokens.count, **body)
    assert refused.value.code == "rate_limit_exceeded"
    headers = refused.value.response.headers
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-remaining-tokens"] == "1000"  # no tokens charged
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        assert (await post(http, "key-a")).status_code == 429  # the same minute's count
        assert (await http.get("/health")).status_code == 200
        assert (await post(http, "key-b")).status_code == 200
        mock_clock.jump(int(headers["retry-after"]))
        assert (await post(http, "key-a")).status_code == 200
