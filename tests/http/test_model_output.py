"""Model output that looks like a call but is not one leaves the server serving.

A reply that is bare JSON with a name that is not a string, while a tool is offered,
once made the tool-call parser raise inside the scheduler and took the server down."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from support import FakeServer, in_thread

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
NOT_A_CALL = '{"name": ["x"], "arguments": {}}'


@pytest.mark.parametrize("stream", [False, True])
async def test_a_call_with_a_name_that_is_not_a_string_stays_text(
    fake_server: FakeServer, stream: bool
) -> None:
    client = fake_server.client(timeout=30)

    def create() -> Any:
        request = {"model": "fake-model", "input": f"echo: {NOT_A_CALL}", "tools": [WEATHER]}
        if not stream:
            return client.responses.create(**request)
        with client.responses.stream(**request) as events:
            kinds = [e.type for e in events]
            assert kinds[-1] == "response.completed"
            return events.get_final_response()

    with trio.fail_after(60):
        resp = await in_thread(create)
        assert resp.status == "completed"
        assert [item.type for item in resp.output] == ["message"]
        assert resp.output_text == NOT_A_CALL
        async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
            assert (await http.get("/health")).json()["status"] == "ok"
        again = await in_thread(
            client.responses.create, model="fake-model", input="echo: still here"
        )
        assert again.status == "completed"
        assert again.output_text == "still here"
