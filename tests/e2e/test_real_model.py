"""End to end: the real server, the real default model, the real `openai` SDK."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from openai.types.responses import Response

from server_process import RealServer, ServerProcesses

pytestmark = __import__("pytest").mark.e2e


def test_quick_example_from_the_readme(real_server: RealServer) -> None:
    client = real_server.client()
    resp = client.responses.create(
        model=real_server.alias, input="Reply with: hello", max_output_tokens=64
    )
    assert isinstance(resp, Response)
    assert resp.status == "completed"
    assert "hello" in resp.output_text.lower()
    assert resp.usage is not None
    assert resp.usage.input_tokens > 5
    assert 0 < resp.usage.output_tokens <= 64


def test_stream_helper_and_final_response(real_server: RealServer) -> None:
    client = real_server.client()
    deltas: list[str] = []
    with client.responses.stream(
        model=real_server.alias,
        input="Name three colours, comma separated.",
        max_output_tokens=32,
        temperature=0,
    ) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert final.status in ("completed", "incomplete")
    assert final.output_text == "".join(deltas)
    assert final.output_text.strip()


def test_raw_sse_order_and_numbering(real_server: RealServer) -> None:
    body = {"model": real_server.alias, "input": "Say hi.", "max_output_tokens": 16, "stream": True}
    events = []
    with httpx.stream("POST", f"{real_server.url}/v1/responses", json=body, timeout=600) as r:
        assert r.status_code == 200
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = json.loads(line.removeprefix("data: "))
                assert data["type"] == name
                events.append(data)
    # A quiet stream (a slow prefill on a busy machine) may carry progress events.
    types = [e["type"] for e in events if e["type"] != "mlx.progress"]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        events[-1]["type"],
    ]
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    assert set(types[4:-4]) <= {"response.output_text.delta"}
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    ids = {e["item_id"] for e in events if "item_id" in e}
    assert ids == {final["output"][0]["id"]}
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert final["output"][0]["content"][0]["text"] == text


def test_length_stop_is_incomplete(real_server: RealServer) -> None:
    resp = real_server.client().responses.create(
        model=real_server.alias, input="Write a long story about a cat.", max_output_tokens=4
    )
    assert resp.status == "incomplete"
    assert resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage is not None
    assert resp.usage.output_tokens == 4


WORDS = [
    "apple",
    "banana",
    "cherry",
    "delta",
    "eagle",
    "falcon",
    "guitar",
    "harbor",
    "island",
    "jungle",
    "kettle",
    "lemon",
    "marble",
    "needle",
    "orange",
    "pepper",
]


def test_sixteen_concurrent_streams_complete_with_their_own_text(
    real_server: RealServer,
) -> None:
    client = real_server.client()

    def one(word: str) -> tuple[str, str]:
        deltas = []
        with client.responses.stream(
            model=real_server.alias,
            input=f"Reply with exactly this word: {word}",
            max_output_tokens=12,
            temperature=0,
        ) as stream:
            for event in stream:
                if event.type == "response.output_text.delta":
                    deltas.append(event.delta)
            return "".join(deltas), stream.get_final_response().output_text

    with ThreadPoolExecutor(len(WORDS)) as pool:
        results = list(pool.map(one, WORDS))
    for word, (streamed, final) in zip(WORDS, results, strict=True):
        assert streamed == final
        assert word in final.lower(), (word, final)


def _open_stream(server: RealServer, body: dict[str, object]) -> socket.socket:
    """A raw streaming request, read until its first text delta, then left unread."""
    host, port = server.url.removeprefix("http://").split(":")
    payload = json.dumps({**body, "stream": True}).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        f"POST /v1/responses HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    seen = b""
    sock.settimeout(300)
    while b"response.output_text.delta" not in seen:
        chunk = sock.recv(65536)
        assert chunk, seen
        seen += chunk
    return sock


def test_full_queue_is_503_and_a_disconnect_frees_the_slot(
    one_slot_server: RealServer,
) -> None:
    server = one_slot_server
    long_body = {
        "model": server.alias,
        "input": "Count from 1 to 1000, one per line.",
        "max_output_tokens": 2000,
    }
    sock = _open_stream(server, long_body)
    quick = {"model": server.alias, "input": "Say ok.", "max_output_tokens": 4}
    busy = httpx.post(f"{server.url}/v1/responses", json=quick, timeout=60)
    assert busy.status_code == 503
    assert set(busy.json()["error"]) == {"message", "type", "param", "code"}
    sock.close()
    deadline = time.monotonic() + 60
    while True:
        r = httpx.post(f"{server.url}/v1/responses", json=quick, timeout=600)
        if r.status_code == 200:
            break
        assert r.status_code == 503
        assert time.monotonic() < deadline, "the slot was never freed"
        time.sleep(0.2)
    assert r.json()["status"] in ("completed", "incomplete")


def test_sigterm_and_sigint_stop_the_server_cleanly(tmp_path: Path) -> None:
    import signal

    for signum in (signal.SIGTERM, signal.SIGINT):
        started = ServerProcesses(tmp_path / f"server-{signum}")
        try:
            server = started.launch_real()
            server.wait_ready()
            server.proc.send_signal(signum)
            assert server.proc.wait(timeout=60) == 0, server.log.read_text()
            assert "Traceback" not in server.log.read_text()
        finally:
            started.close()


def test_logprobs_with_top_alternatives(real_server: RealServer) -> None:
    client = real_server.client()
    resp = client.responses.create(
        model=real_server.alias,
        input="Count: one, two,",
        max_output_tokens=8,
        temperature=0,
        top_logprobs=3,
        include=["message.output_text.logprobs"],
    )
    part = resp.output[0].content[0]  # type: ignore[union-attr]
    assert part.type == "output_text"
    assert part.logprobs
    assert "".join(entry.token for entry in part.logprobs) == part.text
    for entry in part.logprobs:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        values = [alt.logprob for alt in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        # Greedy decoding picks the most likely token.
        assert entry.top_logprobs[0].token == entry.token
    plain = client.responses.create(model=real_server.alias, input="Hi.", max_output_tokens=4)
    assert plain.output[0].content[0].logprobs == []  # type: ignore[union-attr]
