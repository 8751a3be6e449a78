"""End to end on the real model: a `custom` tool (free-form input) with the `openai` SDK."""

from __future__ import annotations

import pytest
from openai.types.responses import ResponseCustomToolCall

from server_process import RealServer

pytestmark = pytest.mark.e2e

SHOUT = {
    "type": "custom",
    "name": "shout",
    "description": "Shout a short word.",
    "format": {"type": "grammar", "syntax": "regex", "definition": "[A-Z]+"},
}


def test_a_forced_custom_tool_streams_a_call_and_takes_its_output(
    real_server: RealServer,
) -> None:
    client = real_server.client()
    with client.responses.stream(
        model=real_server.alias,
        input="Shout the word hi.",
        tools=[SHOUT],  # type: ignore[list-item]
        tool_choice={"type": "custom", "name": "shout"},
        temperature=0,
        max_output_tokens=48,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert final.status == "completed"
    (call,) = final.output
    assert isinstance(call, ResponseCustomToolCall)
    assert call.name == "shout"
    assert isinstance(call.input, str)
    assert call.input.strip()
    deltas = [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"]
    (done,) = [e for e in events if e.type == "response.custom_tool_call_input.done"]
    assert "".join(deltas) == done.input == call.input

    answer = client.responses.create(
        model=real_server.alias,
        previous_response_id=final.id,
        tools=[SHOUT],  # type: ignore[list-item]
        input=[{"type": "custom_tool_call_output", "call_id": call.call_id, "output": "HI!"}],
        temperature=0,
        max_output_tokens=32,
    )
    assert answer.status in ("completed", "incomplete")
    assert answer.output  # the model answered the tool's output
