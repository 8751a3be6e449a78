"""`/v1/completions` over real HTTP with the `openai` SDK: a raw prompt, no chat template
(the fake engine renders one token per character and answers `echo: TEXT` with TEXT)."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from support import FakeServer, an_ordinary_request_completes, in_thread


async def test_a_raw_prompt_is_completed_without_a_chat_template(
    fake_server: FakeServer,
) -> None:
    client = fake_server.client()
    prompt = "echo: a b c"
    completion = await in_thread(client.completions.create, model="fake-model", prompt=prompt)
    assert completion.object == "text_completion"
    assert completion.id.startswith("cmpl-")
    [choice] = completion.choices
    assert (choice.text, choice.finish_reason, choice.logprobs) == ("a b c", "stop", None)
    assert completion.usage is not None
    # Every prompt token is the client's: nothing of a template was added.
    assert completion.usage.prompt_tokens == len(prompt)
    assert completion.usage.completion_tokens == 3


async def test_max_tokens_defaults_to_16(fake_server: FakeServer) -> None:
    client = fake_server.client()
    words = " ".join(f"w{i}" for i in range(30))
    completion = await in_thread(
        client.completions.create, model="fake-model", prompt=[f"echo: {words}"]
    )
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 16


async def test_echo_and_logprobs(fake_server: FakeServer) -> None:
    client = fake_server.client()
    completion = await in_thread(
        client.completions.create, model="fake-model", prompt="echo: x y", echo=True, logprobs=2
    )
    [choice] = completion.choices
    assert choice.text == "echo: x yx y"
    assert choice.logprobs is not None
    assert choice.logprobs.tokens == ["x", " y"]
    assert choice.logprobs.token_logprobs == [-0.5, -0.5]
    assert choice.logprobs.text_offset == [9, 10]
    assert choice.logprobs.top_logprobs == [{"x": -0.5, "alt1": -1.5}, {" y": -0.5, "alt1": -1.5}]


async def test_a_stream_with_usage_and_a_stop_string(fake_server: FakeServer) -> None:
    client = fake_server.client()

    def run() -> list[Any]:
        stream = client.completions.create(
            model="fake-model",
            prompt="echo: one two three four",
            stop=["three"],
            stream=True,
            stream_options={"include_usage": True},
        )
        return list(stream)

    chunks = await in_thread(run)
    assert all(c.object == "text_completion" for c in chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "one two "
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 3


@pytest.mark.parametrize(
    ("change", "param"),
    [
        pytest.param({"prompt": ["a", "b"]}, "prompt", id="two-prompts"),
        pytest.param({"prompt": [1, 2, 3]}, "prompt", id="token-prompt"),
        pytest.param({"best_of": 2}, "best_of", id="best-of"),
        pytest.param({"n": 9}, "n", id="n-above-the-bound"),
        pytest.param({"suffix": "end"}, "suffix", id="suffix"),
        pytest.param({"logprobs": 9}, "logprobs", id="logprobs"),
        pytest.param({"max_tokens": 0}, "max_tokens", id="max-tokens"),
    ],
)
async def test_bad_fields_are_openai_shaped_400s(
    fake_server: FakeServer, change: dict[str, Any], param: str
) -> None:
    body = {"model": "fake-model", "prompt": "hi"} | change
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        r = await http.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["param"] or "").startswith(param), error


async def test_the_root_route_answers_too(fake_server: FakeServer) -> None:
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        r = await http.post("/completions", json={"model": "fake-model", "prompt": "echo: ok"})
    assert r.json()["choices"][0]["text"] == "ok"


@pytest.mark.parametrize("prompt", ["", [""]], ids=["empty", "one-empty"])
async def test_an_empty_prompt_is_a_400_before_any_slot(
    fake_server: FakeServer, prompt: str | list[str]
) -> None:
    """A prompt of no tokens used to reach the model (a 500 and a traceback on the real
    one); it is refused before it takes a slot, streamed or not."""
    client = fake_server.client()
    with pytest.raises(openai.BadRequestError) as refused:
        await in_thread(client.completions.create, model="fake-model", prompt=prompt)
    assert refused.value.code == "invalid_value"
    assert refused.value.param == "prompt"
    assert "empty" in refused.value.message
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        body = {"model": "fake-model", "prompt": prompt, "stream": True}
        r = await http.post("/v1/completions", json=body)
        assert r.status_code == 400, r.text
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert not fake_server.engine.prompts  # nothing reached the engine
    await an_ordinary_request_completes(fake_server)
