"""End to end on the real model: `truncation: "auto"` lets a conversation longer than the
context window (here a 1,024-token one) still answer its last question."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from mlxcel.http.responses import TRUNCATED_HEADER

from server_process import RealServer, start_server

pytestmark = pytest.mark.e2e

WINDOW = 1024


@pytest.fixture(scope="module")
def small_window(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    yield from start_server(
        tmp_path_factory.mktemp("server"), "--ctx-size", str(WINDOW), "--parallel", "1"
    )


def long_conversation() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant. Answer briefly."}
    ]
    for n in range(20):
        items.append(
            {"role": "user", "content": f"Note {n}: the build log line {n} reads OK. " * 6}
        )
        items.append({"role": "assistant", "content": f"Noted line {n}: it passed. " * 4})
    items.append(
        {"role": "user", "content": "What is the capital of France? Answer with one word."}
    )
    return items


def test_auto_truncation_answers_an_over_long_conversation(small_window: RealServer) -> None:
    client = small_window.client()
    model = small_window.alias
    history = long_conversation()
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=model, input=history, max_output_tokens=16)
    assert refused.value.code == "context_length_exceeded"
    raw = client.responses.with_raw_response.create(
        model=model, input=history, truncation="auto", max_output_tokens=16, temperature=0
    )
    resp = raw.parse()
    assert resp.status == "completed"
    assert resp.truncation == "auto"
    assert "paris" in resp.output_text.lower()
    dropped = int(raw.headers[TRUNCATED_HEADER])
    assert 0 < dropped < len(history) - 1
    assert dropped % 2 == 0  # whole user/assistant exchanges
    assert resp.usage is not None
    assert resp.usage.input_tokens <= WINDOW - 16
    counted = client.responses.input_tokens.count(
        model=model, input=history, truncation="auto", extra_body={"max_output_tokens": 16}
    )
    assert counted.input_tokens == resp.usage.input_tokens


def test_a_99000_item_conversation_is_cut_by_counting_on_the_real_template(
    small_window: RealServer,
) -> None:
    """The real chat template's counts pick the cut: the prompt fills most of the window
    without passing it, a count agrees with the create, and the server answers on."""
    client = small_window.client()
    model = small_window.alias
    items: list[dict[str, Any]] = [{"role": "system", "content": "Answer briefly."}]
    for n in range(49_499):
        items.append({"role": "user", "content": f"Line {n} of the log reads OK."})
        items.append({"role": "assistant", "content": f"Noted {n}."})
    items.append({"role": "user", "content": "What is the capital of France? One word."})
    assert len(items) == 99_000
    started = time.monotonic()
    raw = client.responses.with_raw_response.create(
        model=model, input=items, truncation="auto", max_output_tokens=8, temperature=0
    )
    resp = raw.parse()
    assert time.monotonic() - started < 120  # generous: the point is it answers at all
    assert resp.status in ("completed", "incomplete")
    assert resp.usage is not None
    assert WINDOW // 2 < resp.usage.input_tokens <= WINDOW - 8
    assert int(raw.headers[TRUNCATED_HEADER]) > 98_000
    with small_window.http() as http:
        body = {"model": model, "input": items, "truncation": "auto", "max_output_tokens": 8}
        counted = http.post("/v1/responses/input_tokens", json=body)
        assert counted.json()["input_tokens"] == resp.usage.input_tokens
        assert http.get("/health").status_code == 200
    again = client.responses.create(model=model, input="Say OK.", max_output_tokens=4)
    assert again.status in ("completed", "incomplete")
