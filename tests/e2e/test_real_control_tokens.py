"""End to end on the real model: no control token reaches a reply's text on any route,
even one a `logit_bias` pushes to the top (`<|im_start|>` is 151644 for the default
model's tokenizer); the reply still ends cleanly."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from anthropic import Anthropic

from server_process import RealServer

pytestmark = pytest.mark.e2e

IM_START = "151644"
PUSHED = {IM_START: 100}
CONTROL_MARKS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|")
INVITING = (
    "Continue this transcript exactly as written, markup included:\n"
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>"
)
"""A prompt that invites the model to write the chat format's markup itself."""


def clean(text: str) -> bool:
    return not any(mark in text for mark in CONTROL_MARKS)


def still_serves(server: RealServer) -> None:
    assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
    ordinary = server.client().chat.completions.create(
        model=server.alias,
        messages=[{"role": "user", "content": "Say hi."}],
        temperature=0,
        max_tokens=8,
    )
    assert ordinary.choices[0].message.content


def test_a_pushed_control_token_never_reaches_a_chat_completion(real_server: RealServer) -> None:
    client = real_server.client()
    asked: dict[str, Any] = {
        "model": real_server.alias,
        "messages": [{"role": "user", "content": "Name three colours."}],
        "temperature": 0,
        "max_tokens": 16,
        "logit_bias": PUSHED,
    }
    completion = client.chat.completions.create(**asked)
    choice = completion.choices[0]
    assert clean(choice.message.content or ""), choice.message.content
    assert choice.finish_reason in ("stop", "length")
    deltas = [
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(**asked, stream=True)
        if chunk.choices
    ]
    assert all(clean(d) for d in deltas), deltas
    assert "".join(deltas) == choice.message.content
    text = client.completions.create(
        model=real_server.alias,
        prompt="Three colours:",
        temperature=0,
        max_tokens=16,
        logit_bias=PUSHED,
    )
    assert clean(text.choices[0].text), text.choices[0].text
    still_serves(real_server)


def test_no_control_token_reaches_a_response_or_a_message(real_server: RealServer) -> None:
    client = real_server.client()
    response = client.responses.create(
        model=real_server.alias, input=INVITING, temperature=0, max_output_tokens=24
    )
    assert response.status in ("completed", "incomplete")
    assert clean(response.output_text), response.output_text
    with client.responses.stream(
        model=real_server.alias, input=INVITING, temperature=0, max_output_tokens=24
    ) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
    assert all(clean(d) for d in deltas), deltas
    with Anthropic(base_url=real_server.url, api_key="sk-no-auth", max_retries=0) as anthropic:
        message = anthropic.messages.create(
            model=real_server.alias,
            max_tokens=24,
            extra_body={"temperature": 0},
            messages=[{"role": "user", "content": INVITING}],
        )
    texts = [b.text for b in message.content if b.type == "text"]
    assert all(clean(t) for t in texts), texts
    assert message.stop_reason in ("end_turn", "max_tokens")
    still_serves(real_server)
