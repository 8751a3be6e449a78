"""Thinking on `/v1/messages`: the `thinking` setting is the template's switch, a trace is
a `thinking` block with its signature, and a block sent back with its signature renders
the trace exactly as it was generated, whatever text came with it (the fake's template
opens a `<think>` block when thinking is on: `echo: TRACE</think> ANSWER`)."""

from __future__ import annotations

from typing import Any

from support import FakeServer, StartServer, in_thread

REPLY = "echo: plan it</think> the answer"
ON = {"type": "enabled", "budget_tokens": 2048}


def ask(server: FakeServer, messages: list[dict[str, Any]], **extra: Any) -> Any:
    create = server.anthropic(**extra.pop("client", {})).messages.create
    return in_thread(create, model="fake-model", max_tokens=64, messages=messages, **extra)


def replay(first: list[dict[str, Any]], blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`first`, the assistant's `blocks`, and a new user turn."""
    return [
        *first,
        {"role": "assistant", "content": blocks},
        {"role": "user", "content": "echo: ok"},
    ]


def assistant_turn(server: FakeServer) -> str:
    """What the model saw of the assistant turn of its last prompt (trace and text)."""
    return server.engine.last_prompt.split("\x01assistant\x02")[1].split("\x01")[0]


async def test_thinking_is_the_templates_switch(start_fake_server: StartServer) -> None:
    server = await start_fake_server(opens_reasoning=True)
    first = [{"role": "user", "content": REPLY}]
    thought = await ask(server, first, thinking=ON)
    assert [b.type for b in thought.content] == ["thinking", "text"]
    assert thought.content[0].thinking == "plan it"
    assert thought.content[1].text.strip() == "the answer"
    adaptive = await ask(server, first, thinking={"type": "adaptive"})
    assert adaptive.content[0].type == "thinking"
    for off in ({"thinking": {"type": "disabled"}}, {}):  # Anthropic's default: off
        plain = await ask(server, first, **off)
        assert [b.type for b in plain.content] == ["text"]


async def test_a_signed_block_sent_back_restores_the_exact_trace(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(opens_reasoning=True)
    first = [{"role": "user", "content": REPLY}]
    thought = await ask(server, first, thinking=ON)
    thinking, text = (b.model_dump() for b in thought.content)
    signature = thinking["signature"]
    # Sent back altered, or emptied: the signature restores the trace as generated.
    for sent in ("something else", ""):
        block = {"type": "thinking", "thinking": sent, "signature": signature}
        await ask(server, replay(first, [block, text]), thinking=ON)
        assert assistant_turn(server).startswith("plan it")
    # A signature this server never gave: the text sent stands.
    forged = {"type": "thinking", "thinking": "my own", "signature": "0" * 64}
    await ask(server, replay(first, [forged, text]), thinking=ON)
    assert assistant_turn(server).startswith("my own")
    # Redacted thinking is dropped (nothing here can read it); the turn without a trace
    # gets its own back from the reasoning echo, as on every route.
    redacted = {"type": "redacted_thinking", "data": "opaque"}
    await ask(server, replay(first, [redacted, text]), thinking=ON)
    assert "opaque" not in server.engine.last_prompt
    assert assistant_turn(server).startswith("plan it")


async def test_an_omitted_trace_is_sent_empty_and_restored_from_its_signature(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(opens_reasoning=True)
    first = [{"role": "user", "content": REPLY}]
    omitted = {"type": "enabled", "budget_tokens": 2048, "display": "omitted"}
    thought = await ask(server, first, thinking=omitted)
    thinking, text = (b.model_dump() for b in thought.content)
    assert thinking["thinking"] == ""
    assert thinking["signature"]

    def stream() -> Any:
        client = server.anthropic()
        with client.messages.stream(
            model="fake-model", max_tokens=64, messages=first, thinking=omitted
        ) as events:
            return events.get_final_message()

    streamed = await in_thread(stream)
    assert streamed.content[0].model_dump() == thinking  # the same block, the same signature
    await ask(server, replay(first, [thinking, text]), thinking=omitted)
    assert assistant_turn(server).startswith("plan it")


async def test_a_signature_shown_to_one_key_restores_nothing_for_another(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(opens_reasoning=True, api_keys=("sk-a", "sk-b"))
    first = [{"role": "user", "content": REPLY}]
    thought = await ask(server, first, thinking=ON, client={"api_key": "sk-a"})
    thinking, text = (b.model_dump() for b in thought.content)
    block = {**thinking, "thinking": "from b"}
    await ask(server, replay(first, [block, text]), thinking=ON, client={"api_key": "sk-b"})
    assert assistant_turn(server).startswith("from b")
    await ask(server, replay(first, [block, text]), thinking=ON, client={"api_key": "sk-a"})
    assert assistant_turn(server).startswith("plan it")


async def test_the_trace_before_a_tool_use_is_restored_too(start_fake_server: StartServer) -> None:
    """Tool loops are where templates keep traces: the turn that called is signed too."""
    server = await start_fake_server(opens_reasoning=True)
    tool = {"name": "f", "input_schema": {"type": "object", "properties": {}}}
    first = [{"role": "user", "content": 'echo: look</think> <tool_call>{"name": "f"}</tool_call>'}]
    called = await ask(server, first, thinking=ON, tools=[tool])
    assert [b.type for b in called.content] == ["thinking", "tool_use"]
    thinking, use = (b.model_dump() for b in called.content)
    result = {"type": "tool_result", "tool_use_id": use["id"], "content": "done"}
    history = [
        *first,
        {"role": "assistant", "content": [{**thinking, "thinking": ""}, use]},
        {"role": "user", "content": [result, {"type": "text", "text": "echo: ok"}]},
    ]
    await ask(server, history, thinking=ON, tools=[tool])
    assert assistant_turn(server).startswith("look")
