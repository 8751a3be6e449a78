"""`truncation: "auto"` over real HTTP with the `openai` SDK on the fake engine (one token
per character, a 4,096-token window): the oldest turns go, the system lead, the last user
turn and call/output pairs stay, and the header says how many items went."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
import trio

from mlxcel.http.responses import TRUNCATED_HEADER
from mlxcel.http.schemas import CreateResponseBody
from mlxcel.model.fake import FakeCodec

from support import FakeServer, an_ordinary_request_completes, in_thread

FILLER = "x" * 300


def turns(count: int) -> list[dict[str, Any]]:
    """`count` user/assistant exchanges of some 600 characters, numbered."""
    out: list[dict[str, Any]] = []
    for n in range(count):
        out.append({"role": "user", "content": f"q{n} {FILLER}"})
        out.append({"role": "assistant", "content": f"a{n} {FILLER}"})
    return out


async def create(server: FakeServer, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=120) as http:
        return await http.post(f"{server.url}/v1/responses", json={"model": "fake-model", **body})


async def test_disabled_keeps_the_400_and_auto_drops_the_oldest(fake_server: FakeServer) -> None:
    client = fake_server.client()
    history = [{"role": "developer", "content": "Be terse."}, *turns(12)]
    history.append({"role": "user", "content": "echo: still here"})
    with pytest.raises(openai.BadRequestError) as refused:
        await in_thread(client.responses.create, model="fake-model", input=history)
    assert refused.value.code == "context_length_exceeded"
    raw = await in_thread(
        client.responses.with_raw_response.create,
        model="fake-model",
        input=history,
        truncation="auto",
        max_output_tokens=100,
    )
    resp = raw.parse()
    assert resp.output_text == "still here"
    assert resp.truncation == "auto"
    dropped = int(raw.headers[TRUNCATED_HEADER])
    prompt = fake_server.engine.prompts[-1]
    assert len(prompt) <= 4096 - 100
    assert prompt.startswith("\x01system\x02Be terse.")  # the lead is kept
    assert "echo: still here" in prompt
    # Whole exchanges went, oldest first: q0..q(k-1) and their answers.
    assert dropped % 2 == 0
    assert dropped > 0
    kept = dropped // 2
    assert f"q{kept - 1} " not in prompt
    assert f"\x01user\x02q{kept} " in prompt
    # The earliest cut that fits: one more exchange would not have.
    assert len(prompt) + 2 * (len(FILLER) + 6) > 4096 - 100
    # Stored input items are what was sent.
    listed = await in_thread(client.responses.input_items.list, resp.id, limit=100)
    assert len(listed.data) == len(history)


async def test_an_input_that_fits_drops_nothing(fake_server: FakeServer) -> None:
    r = await create(fake_server, {"input": "echo: hi", "truncation": "auto"})
    assert r.status_code == 200
    assert r.headers[TRUNCATED_HEADER] == "0"
    assert r.json()["truncation"] == "auto"
    r = await create(fake_server, {"input": "echo: hi"})
    assert TRUNCATED_HEADER not in r.headers


async def test_a_call_is_never_parted_from_its_output(fake_server: FakeServer) -> None:
    big = "y" * 1500
    history: list[dict[str, Any]] = [{"role": "user", "content": "q0 " + FILLER}]
    for n in range(3):
        call = {"type": "function_call", "call_id": f"c{n}", "name": "f", "arguments": "{}"}
        history += [call, {"type": "function_call_output", "call_id": f"c{n}", "output": big}]
    history.append({"role": "user", "content": "echo: done"})
    r = await create(fake_server, {"input": history, "truncation": "auto"})
    assert r.status_code == 200, r.text
    prompt = fake_server.engine.prompts[-1]
    calls = prompt.count('"c0"') + prompt.count('"c1"') + prompt.count('"c2"')
    outputs = prompt.count(big)
    assert calls == outputs  # each call rendered has its output, and no output is alone
    assert int(r.headers[TRUNCATED_HEADER]) in (3, 5, 7)  # the user turn, then whole pairs


async def test_the_last_user_turn_alone_too_long_is_still_a_400(fake_server: FakeServer) -> None:
    body = {"input": [*turns(2), {"role": "user", "content": "z" * 5000}], "truncation": "auto"}
    r = await create(fake_server, body)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"


async def test_a_chain_is_truncated_too(fake_server: FakeServer) -> None:
    client = fake_server.client()
    first = await in_thread(
        client.responses.create,
        model="fake-model",
        input=[*turns(3), {"role": "user", "content": "echo: one"}],
    )
    r = await create(
        fake_server,
        {
            "input": [*turns(4), {"role": "user", "content": "echo: two"}],
            "previous_response_id": first.id,
            "truncation": "auto",
            "max_output_tokens": 50,
        },
    )
    assert r.status_code == 200, r.text
    assert int(r.headers[TRUNCATED_HEADER]) > 0
    assert r.json()["output"][0]["content"][0]["text"] == "two"


async def test_stream_and_input_tokens_honour_it(fake_server: FakeServer) -> None:
    history = [*turns(12), {"role": "user", "content": "echo: streamed"}]
    async with httpx.AsyncClient(timeout=60) as http:
        body = {"model": "fake-model", "input": history, "truncation": "auto", "stream": True}
        async with http.stream("POST", f"{fake_server.url}/v1/responses", json=body) as r:
            assert r.status_code == 200
            assert int(r.headers[TRUNCATED_HEADER]) > 0
            text = (await r.aread()).decode()
        assert "response.completed" in text
        counted = await http.post(
            f"{fake_server.url}/v1/responses/input_tokens",
            json={"model": "fake-model", "input": history, "truncation": "auto"},
        )
    assert counted.status_code == 200
    assert counted.json()["input_tokens"] <= 4096 - 1024


async def test_a_background_job_is_truncated_as_it_is_queued(fake_server: FakeServer) -> None:
    client = fake_server.client()
    history = [*turns(12), {"role": "user", "content": "echo: later"}]
    raw = await in_thread(
        client.responses.with_raw_response.create,
        model="fake-model",
        input=history,
        truncation="auto",
        background=True,
    )
    assert int(raw.headers[TRUNCATED_HEADER]) > 0
    queued = raw.parse()
    for _ in range(500):
        final = await in_thread(client.responses.retrieve, queued.id)
        if final.status not in ("queued", "in_progress"):
            break
        await trio.sleep(0.02)
    assert final.status == "completed"
    assert final.output_text == "later"
    assert final.truncation == "auto"


async def test_a_100k_item_input_is_cut_quickly(fake_server: FakeServer) -> None:
    """The largest input the edge takes (100,000 items) renders only what fits; the server
    stays healthy."""
    items: list[dict[str, Any]] = [{"role": "developer", "content": "lead"}]
    items += [{"role": "user" if n % 2 else "assistant", "content": f"m{n}"} for n in range(99_998)]
    items.append({"role": "user", "content": "echo: end"})
    assert len(items) == 100_000
    r = await create(fake_server, {"input": items, "truncation": "auto", "store": False})
    assert r.status_code == 200, r.text
    assert r.json()["output"][0]["content"][0]["text"] == "end"
    dropped = int(r.headers[TRUNCATED_HEADER])
    assert 99_000 < dropped < 99_999
    r = await create(fake_server, {"input": [*items, {"role": "user", "content": "one more"}]})
    assert r.status_code == 400  # over the edge's item bound, truncation or not
    async with httpx.AsyncClient(timeout=10) as http:
        assert (await http.get(f"{fake_server.url}/health")).status_code == 200
    await an_ordinary_request_completes(fake_server)


def test_the_schema_accepts_both_values() -> None:
    for value in ("auto", "disabled"):
        body = CreateResponseBody.model_validate({"model": "m", "input": "x", "truncation": value})
        assert body.truncation == value


WINDOW = 4096
"""The fake server's context window (and the fake codec's one token per character)."""


class RenderCount:
    """Every prompt the fake codec renders in this process: the calls, the messages and
    the tokens (the work truncation does)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.messages = 0
        self.tokens = 0
        render = FakeCodec.render

        def counted(codec: FakeCodec, messages: Any, *args: Any, **kwargs: Any) -> list[int]:
            self.calls += 1
            self.messages += len(messages)
            prompt = render(codec, messages, *args, **kwargs)
            self.tokens += len(prompt)
            return prompt

        monkeypatch.setattr(FakeCodec, "render", counted)


async def test_a_huge_lead_is_refused_after_counting_what_could_fit(
    fake_server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """99,000 developer messages (always kept) cannot fit: the 400 comes once the messages
    counted pass the window, not after rendering all of them (a create and a count)."""
    items: list[dict[str, Any]] = [{"role": "developer", "content": f"d{n}"} for n in range(99_000)]
    items.append({"role": "user", "content": "echo: end"})
    work = RenderCount(monkeypatch)
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=120) as http:
        with trio.fail_after(60):  # generous: it used to hold a thread for seconds
            for path in ("/v1/responses", "/v1/responses/input_tokens"):
                body = {"model": "fake-model", "input": items, "truncation": "auto"}
                r = await http.post(path, json=body)
                assert r.status_code == 400, r.text
                assert r.json()["error"]["code"] == "context_length_exceeded"
    # A 4,096-token window holds a few hundred such messages: each is counted once, and
    # the work is a few windows' worth, whatever the input's length.
    assert work.tokens < 10 * WINDOW, (work.calls, work.messages, work.tokens)
    await an_ordinary_request_completes(fake_server)


async def test_the_work_follows_what_is_kept_not_what_was_sent(
    fake_server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tool-call group of 5,000 items that cannot fit (its outputs after all its calls:
    no cut inside) is never rendered whole: the turns after it are counted once each, the
    group only until the window is full, then one prompt is rendered."""
    calls = [
        {"type": "function_call", "call_id": f"c{n}", "name": "f", "arguments": "{}"}
        for n in range(2_500)
    ]
    outputs = [
        {"type": "function_call_output", "call_id": f"c{n}", "output": "ok"} for n in range(2_500)
    ]
    items: list[dict[str, Any]] = [{"role": "user", "content": "start"}, *calls, *outputs]
    items += turns(3)
    items.append({"role": "user", "content": "echo: kept"})
    work = RenderCount(monkeypatch)
    r = await create(fake_server, {"input": items, "truncation": "auto", "store": False})
    assert r.status_code == 200, r.text
    assert r.json()["output"][0]["content"][0]["text"] == "kept"
    assert int(r.headers[TRUNCATED_HEADER]) == 5_001  # the first turn and the group went
    assert work.tokens < 10 * WINDOW, (work.calls, work.messages, work.tokens)
    await an_ordinary_request_completes(fake_server)
