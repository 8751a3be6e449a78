"""`GET /metrics` over real HTTP (fake engine): the Prometheus text parses, its names
follow the conventions, and each series moves by what the requests did."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

from mlxcel.model.fake import FakeEngine

from support import (
    LONG,
    FakeServer,
    StartServer,
    an_ordinary_request_completes,
    in_thread,
    raw_request,
    read_until,
    wait_until,
)

RESPONSES = "/v1/responses"


@dataclass(frozen=True)
class Scrape:
    """One scrape: its families, and each sample's value by name and labels."""

    types: dict[str, str]
    values: dict[tuple[str, frozenset[tuple[str, str]]], float]

    def __call__(self, name: str, **labels: str) -> float:
        """The sample with exactly these labels; without labels, the server-wide value
        (a generation series' samples added up over its models)."""
        if labels:
            return self.values.get((name, frozenset(labels.items())), 0.0)
        return sum(
            value
            for (sample, key), value in self.values.items()
            if sample == name and {label for label, _ in key} <= {"model"}
        )

    def labelled(self, name: str, label: str) -> set[str]:
        """Every value `label` takes in the samples of `name`."""
        return {dict(key)[label] for sample, key in self.values if sample == name}


def parse(text: str) -> Scrape:
    types: dict[str, str] = {}
    values: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            values[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return Scrape(types, values)


async def get_metrics(server: FakeServer, path: str = "/metrics", **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        return await http.get(path, headers=headers)


async def scrape(server: FakeServer) -> Scrape:
    r = await get_metrics(server)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(r.text)


async def settled(server: FakeServer, holds: Callable[[Scrape], bool]) -> Scrape:
    """Scrape until `holds`: an exchange is counted once its last byte has left, which
    can be a moment after its client has read it."""
    with trio.fail_after(10):
        while not holds(found := await scrape(server)):  # noqa: ASYNC110 - polled over HTTP
            await trio.sleep(0.02)
    return found


def requests(s: Scrape, route: str, status: str, method: str = "POST") -> float:
    return s("mlxcel_http_requests_total", route=route, method=method, status=status)


async def test_the_scrape_is_prometheus_text_with_conventional_names(
    fake_server: FakeServer,
) -> None:
    s = await scrape(fake_server)
    assert s.types, "no families"
    for family, kind in s.types.items():
        assert family.startswith("mlxcel_"), family
        if kind == "histogram":
            assert family.endswith("_seconds"), family
        if "bytes" in family:
            assert family.endswith("_bytes"), family
    for (sample, _), _value in s.values.items():
        if s.types.get(sample.removesuffix("_total")) == "counter":
            assert sample.endswith("_total"), sample
        assert not sample.endswith("_created"), sample
    assert (s("mlxcel_slots"), s("mlxcel_slots_busy"), s("mlxcel_queue_depth")) == (4, 0, 0)
    tables = {"responses", "conversations", "ephemeral", "active", "events"}
    assert s.labelled("mlxcel_store_entries", "table") == tables
    assert s.labelled("mlxcel_store_bytes", "table") == tables
    assert s.labelled("mlxcel_background_jobs", "status") == {"queued", "in_progress"}
    for name in ("time_to_first_token", "inter_token_latency", "engine_step"):
        assert s.types[f"mlxcel_{name}_seconds"] == "histogram"
    for name in ("prompt_tokens", "output_tokens", "prompt_cache_hit_tokens"):
        assert s.types[f"mlxcel_{name}"] == "counter"


async def test_a_request_moves_requests_tokens_and_latencies(fake_server: FakeServer) -> None:
    before = await scrape(fake_server)
    steps = fake_server.engine.steps
    client = fake_server.client()
    reply = await in_thread(client.responses.create, model="fake-model", input="echo: a b c")
    assert reply.usage is not None
    assert reply.usage.output_tokens == 3
    after = await settled(fake_server, lambda s: requests(s, RESPONSES, "200") >= 1)

    def moved(name: str, **labels: str) -> float:
        return after(name, **labels) - before(name, **labels)

    assert moved("mlxcel_http_requests_total", route=RESPONSES, method="POST", status="200") == 1
    assert moved("mlxcel_http_request_duration_seconds_count", route=RESPONSES) == 1
    # The first scrape was counted once it was over.
    assert moved("mlxcel_http_requests_total", route="/metrics", method="GET", status="200") == 1
    assert moved("mlxcel_prompt_tokens_total") == reply.usage.input_tokens
    assert moved("mlxcel_output_tokens_total") == 3
    assert moved("mlxcel_time_to_first_token_seconds_count") == 1
    assert moved("mlxcel_inter_token_latency_seconds_count") == 2
    assert moved("mlxcel_response_duration_seconds_count") == 1
    assert moved("mlxcel_engine_step_seconds_count") == fake_server.engine.steps - steps >= 3
    assert moved("mlxcel_time_to_first_token_seconds_sum") > 0
    assert after("mlxcel_slots_busy") == 0


async def test_a_stream_is_timed_to_its_last_byte(start_fake_server: StartServer) -> None:
    server = await start_fake_server(FakeEngine(step_delay=0.05))
    before = await scrape(server)
    client = server.client()
    with await in_thread(
        client.responses.create, model="fake-model", input="echo: a b c d e f g h", stream=True
    ) as stream:
        events = await in_thread(list, stream)
    assert events[-1].type == "response.completed"
    after = await settled(server, lambda s: requests(s, RESPONSES, "200") >= 1)
    assert requests(after, RESPONSES, "200") == 1
    # Eight tokens 50 ms apart: the exchange lasted as long as its body, not its head.
    duration = "mlxcel_http_request_duration_seconds_sum"
    assert after(duration, route=RESPONSES) - before(duration, route=RESPONSES) >= 0.35
    assert after("mlxcel_inter_token_latency_seconds_count") == 7
    assert after("mlxcel_inter_token_latency_seconds_sum") >= 0.3
    assert after("mlxcel_output_tokens_total") == 8


async def test_refusals_are_counted_by_route_rule_and_status(fake_server: FakeServer) -> None:
    before = await scrape(fake_server)
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        bad = await http.post(RESPONSES, json={"model": "fake-model", "input": "x", "top_p": 7})
        assert bad.status_code == 400, bad.text
        for n in range(3):
            assert (await http.get(f"/v1/responses/resp_missing{n}")).status_code == 404
            assert (await http.get(f"/no/such/path/{n}")).status_code == 404
        assert (await http.request("BREW", "/v1/models")).status_code == 405
    after = await settled(fake_server, lambda s: requests(s, "unmatched", "404", "GET") >= 3)
    assert requests(after, RESPONSES, "400") == 1
    # Labelled by the URL rule, not the raw path: one series for many paths.
    assert requests(after, "/v1/responses/<response_id>", "404", "GET") == 3
    assert requests(after, "unmatched", "404", "GET") == 3
    assert requests(after, "unmatched", "405", "other") == 1  # no rule takes BREW
    routes = after.labelled("mlxcel_http_requests_total", "route")
    assert not any("missing" in route or "/no/" in route for route in routes)
    assert after.labelled("mlxcel_http_requests_total", "method") <= {"GET", "POST", "other"}
    # Nothing was generated.
    assert after("mlxcel_prompt_tokens_total") == before("mlxcel_prompt_tokens_total") == 0
    assert after("mlxcel_time_to_first_token_seconds_count") == 0


async def test_background_jobs_by_status_and_the_waiting_line(
    start_fake_server: StartServer,
) -> None:
    engine = FakeEngine()
    engine.hold()  # one job runs and one waits until released
    server = await start_fake_server(engine, parallel=1)
    client = server.client()
    running = await in_thread(
        client.responses.create,
        model="fake-model",
        input=LONG,
        background=True,
        max_output_tokens=40,
    )
    queued = await in_thread(
        client.responses.create, model="fake-model", input=LONG, background=True
    )
    with trio.fail_after(5):
        await wait_until(lambda: engine.active == 1 and engine.held > 2)
    s = await scrape(server)
    assert s("mlxcel_background_jobs", status="in_progress") == 1
    assert s("mlxcel_background_jobs", status="queued") == 1
    assert (s("mlxcel_slots"), s("mlxcel_slots_busy"), s("mlxcel_queue_depth")) == (1, 1, 1)
    assert s("mlxcel_store_entries", table="active") == 2
    assert s("mlxcel_store_bytes", table="active") > 0
    assert (await in_thread(client.responses.cancel, queued.id)).status == "cancelled"
    engine.release()

    def both_ended(s: Scrape) -> bool:
        ended = "mlxcel_background_jobs_ended_total"
        return s(ended, status="cancelled") + s(ended, status="incomplete") == 2

    s = await settled(server, both_ended)
    assert (await in_thread(client.responses.retrieve, running.id)).status == "incomplete"
    assert s("mlxcel_background_jobs_ended_total", status="cancelled") == 1
    assert s("mlxcel_background_jobs_ended_total", status="incomplete") == 1
    assert s("mlxcel_background_jobs_ended_total", status="completed") == 0
    assert s("mlxcel_background_jobs", status="in_progress") == 0
    assert s("mlxcel_background_jobs", status="queued") == 0
    s = await settled(server, lambda s: s("mlxcel_store_entries", table="active") == 0)
    assert s("mlxcel_store_entries", table="responses") == 2
    assert (s("mlxcel_slots_busy"), s("mlxcel_queue_depth")) == (0, 0)
    assert s("mlxcel_output_tokens_total") == 40  # the cancelled job never ran


async def test_store_tables_follow_puts_and_deletes(fake_server: FakeServer) -> None:
    client = fake_server.client()
    empty = await scrape(fake_server)
    for table in ("responses", "conversations", "ephemeral", "active"):
        assert empty("mlxcel_store_entries", table=table) == 0
        assert empty("mlxcel_store_bytes", table=table) == 0
    stored = await in_thread(client.responses.create, model="fake-model", input="echo: keep")
    conversation = await in_thread(client.conversations.create)
    job = await in_thread(
        client.responses.create,
        model="fake-model",
        input="echo: brief",
        background=True,
        store=False,
    )
    full = await settled(fake_server, lambda s: s("mlxcel_store_entries", table="ephemeral") == 1)
    assert job.id
    for table in ("responses", "conversations", "ephemeral"):
        assert full("mlxcel_store_entries", table=table) == 1
        assert full("mlxcel_store_bytes", table=table) > 0
    assert full("mlxcel_store_entries", table="active") == 0
    await in_thread(client.responses.delete, stored.id)
    await in_thread(client.conversations.delete, conversation.id)
    after = await scrape(fake_server)
    for table in ("responses", "conversations"):
        assert after("mlxcel_store_entries", table=table) == 0
        assert after("mlxcel_store_bytes", table=table) == 0
    assert after("mlxcel_store_entries", table="ephemeral") == 1


async def test_metrics_need_the_api_key_unless_public(start_fake_server: StartServer) -> None:
    guarded = await start_fake_server(api_keys=("sk-right",))
    for path in ("/metrics", "/v1/metrics"):
        refused = await get_metrics(guarded, path)
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_api_key"
        assert set(refused.json()["error"]) == {"message", "type", "param", "code"}
        wrong = await get_metrics(guarded, path, Authorization="Bearer sk-wrong")
        assert wrong.status_code == 401
        allowed = await get_metrics(guarded, path, Authorization="Bearer sk-right")
        assert allowed.status_code == 200
        assert parse(allowed.text)("mlxcel_slots") == 4
    public = await start_fake_server(api_keys=("sk-right",), metrics_public=True)
    for path in ("/metrics", "/v1/metrics"):
        assert (await get_metrics(public, path)).status_code == 200
    # Only the metrics are open: the API still needs the key.
    assert (await get_metrics(public, "/v1/models")).status_code == 401
    s = await settled(public, lambda s: requests(s, "/v1/models", "401", "GET") == 1)
    assert requests(s, "/metrics", "200", "GET") == 1


async def test_a_client_that_hangs_up_mid_stream_is_counted_and_frees_its_slot(
    start_fake_server: StartServer,
) -> None:
    engine = FakeEngine()
    engine.hold()  # the stream runs until its client hangs up
    server = await start_fake_server(engine, parallel=1)
    stream = await raw_request(server.url, {"model": "fake-model", "input": LONG, "stream": True})
    await read_until(stream, b"response.output_text.delta")
    await stream.aclose()

    def over(s: Scrape) -> bool:
        return s("mlxcel_slots_busy") == 0 and s("mlxcel_response_duration_seconds_count") == 1

    s = await settled(server, over)
    assert requests(s, RESPONSES, "200") == 1  # its answer had started
    assert s("mlxcel_time_to_first_token_seconds_count") == 1
    assert 1 <= s("mlxcel_output_tokens_total") < 300


async def test_only_get_scrapes(fake_server: FakeServer) -> None:
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        refused = await http.post("/metrics", json={})
    assert refused.status_code == 405
    assert set(refused.json()["error"]) == {"message", "type", "param", "code"}
    await an_ordinary_request_completes(fake_server)


async def test_the_messages_routes_are_counted_by_their_rules(fake_server: FakeServer) -> None:
    """Anthropic's routes (Claude Code adds `?beta=true`): counted under their rules, and
    their tokens in the same series as every route's."""
    before = await scrape(fake_server)
    body = {"model": "fake-model", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        for path in ("/v1/messages?beta=true", "/v1/messages/count_tokens"):
            assert (await http.post(path, json=body)).status_code == 200
        assert (await http.post("/v1/messages", json={"model": "fake-model"})).status_code == 400
    after = await settled(fake_server, lambda s: requests(s, "/v1/messages", "400") >= 1)
    assert requests(after, "/v1/messages", "200") == 1
    assert requests(after, "/v1/messages/count_tokens", "200") == 1
    assert after("mlxcel_output_tokens_total") - before("mlxcel_output_tokens_total") > 0
