"""End to end on the real model: LiteLLM as its documentation shows it for an
OpenAI-compatible server (`model="openai/<name>"`, `api_base`): `completion` called,
streamed and with a tool, and `responses`."""

from __future__ import annotations

import asyncio
import inspect
import json
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from server_process import RealServer

pytestmark = pytest.mark.e2e

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def litellm() -> Iterator[Any]:
    """The `litellm` module, with its bundled model price list (it would fetch one over
    the network at import otherwise); after the module, the clients it cached are closed
    and the event loop it made for its logging is closed, so neither is left to the
    garbage collector during a later test."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import litellm

    yield litellm
    for client in list(litellm.in_memory_llm_clients_cache.cache_dict.values()):
        close = getattr(client, "close", None)
        if callable(close) and not inspect.iscoroutinefunction(close):
            close()
    litellm.in_memory_llm_clients_cache.flush_cache()  # type: ignore[no-untyped-call]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            loop = asyncio.get_event_loop_policy().get_event_loop()
        except RuntimeError:  # none is set (an earlier `asyncio.run` unset it): none made
            return
    loop.close()
    asyncio.set_event_loop(None)


def _target(server: RealServer) -> dict[str, Any]:
    return {
        "model": f"openai/{server.alias}",
        "api_base": f"{server.url}/v1",
        "api_key": "sk-no-auth",
        "temperature": 0,
    }


def test_completion_called_and_streamed(litellm: Any, real_server: RealServer) -> None:
    target = _target(real_server)
    reply = litellm.completion(
        messages=[{"role": "user", "content": "Reply with: hello"}], max_tokens=16, **target
    )
    assert reply.choices[0].message.content.strip()
    assert reply.usage.prompt_tokens > 0
    chunks = list(
        litellm.completion(
            messages=[{"role": "user", "content": "Count to three."}],
            max_tokens=16,
            stream=True,
            **target,
        )
    )
    deltas = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
    assert len(deltas) > 1  # it streamed, not one block at the end
    assert "".join(deltas).strip()


def test_completion_with_a_tool(litellm: Any, real_server: RealServer) -> None:
    reply = litellm.completion(
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=64,
        **_target(real_server),
    )
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments).get("city"), str)
    assert reply.choices[0].finish_reason == "tool_calls"


def test_responses_call(litellm: Any, real_server: RealServer) -> None:
    reply = litellm.responses(
        input="Reply with: hello", max_output_tokens=16, **_target(real_server)
    )
    assert reply.status == "completed"
    assert reply.output_text.strip()
    assert reply.id.startswith("resp_")
