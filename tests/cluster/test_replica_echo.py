"""The reasoning-echo cache on a shared Redis store: a history resent to another replica
without its reasoning finds the trace the first replica returned (subprocess servers on
the fake engine, started with the real flags)."""

from __future__ import annotations

from redis_server import RedisServer
from server_process import MODEL, ServerProcesses


def test_a_dropped_reasoning_trace_is_found_on_another_replica(
    servers: ServerProcesses, redis_server: RedisServer, redis_prefix: str
) -> None:
    shared = ("--store", redis_server.url, "--redis-key-prefix", redis_prefix)
    first, second = servers.start_replicas(2, *shared)
    said = [{"role": "user", "content": "echo: <think>secret plan</think> answer"}]
    with first.http() as http:
        created = http.post("/v1/responses", json={"model": MODEL, "input": said}).json()
    assert [item["type"] for item in created["output"]] == ["reasoning", "message"]

    reasoning, message = created["output"]
    nxt = {"role": "user", "content": "echo: next"}
    without_trace = {"model": MODEL, "input": [*said, message, nxt]}
    with_trace = {"model": MODEL, "input": [*said, reasoning, message, nxt]}
    with second.http() as http:
        counts = [
            http.post("/v1/responses/input_tokens", json=body).json()["input_tokens"]
            for body in (without_trace, with_trace)
        ]
    # The other replica puts back the trace the client dropped.
    assert counts[0] == counts[1]

    elsewhere = ("--store", redis_server.url, "--redis-key-prefix", redis_prefix + "-other")
    stranger = servers.start(*elsewhere)
    with stranger.http() as http:
        fresh = http.post("/v1/responses/input_tokens", json=without_trace).json()
    assert fresh["input_tokens"] < counts[0]  # a store that never saw the turn has nothing
