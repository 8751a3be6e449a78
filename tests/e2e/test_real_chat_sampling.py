"""End to end on the real model: penalties, `logit_bias` and `n` on Chat Completions."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from server_process import RealServer

pytestmark = pytest.mark.e2e

REPEAT = [{"role": "user", "content": "Repeat after me: cat cat cat cat cat cat cat cat cat cat"}]
CAPITAL = [{"role": "user", "content": "What is the capital of France? One word."}]


def _ask(server: RealServer, messages: list[dict[str, Any]], **extra: Any) -> str:
    completion = server.client().chat.completions.create(
        model=server.alias, messages=messages, temperature=0, **extra
    )
    return completion.choices[0].message.content or ""


def test_a_frequency_penalty_changes_greedy_output_and_cuts_repetition(
    real_server: RealServer,
) -> None:
    plain = _ask(real_server, REPEAT, max_tokens=40)
    penalised = _ask(real_server, REPEAT, max_tokens=40, frequency_penalty=2.0)
    assert plain.lower().count("cat") >= 6, plain
    assert penalised != plain
    assert penalised.lower().count("cat") < plain.lower().count("cat"), penalised
    # Before the first token nothing was generated: no penalty applies to it.
    tokens = real_server.client().chat.completions.create(
        model=real_server.alias,
        messages=REPEAT,
        temperature=0,
        max_tokens=1,
        presence_penalty=2.0,
        frequency_penalty=2.0,
    )
    assert plain.startswith(tokens.choices[0].message.content or "\x00")


def test_logit_bias_bans_and_forces_tokens(real_server: RealServer, tokenizer: Any) -> None:
    plain = _ask(real_server, CAPITAL, max_tokens=8)
    assert "Paris" in plain
    first = tokenizer.encode("Paris", add_special_tokens=False).ids[0]
    banned = _ask(real_server, CAPITAL, max_tokens=8, logit_bias={str(first): -100})
    assert not banned.startswith("Paris"), banned
    forced_id = tokenizer.encode(" banana", add_special_tokens=False).ids[0]
    forced = _ask(real_server, CAPITAL, max_tokens=5, logit_bias={str(forced_id): 100})
    assert forced.strip() == tokenizer.decode([forced_id] * 5).strip(), forced


def test_n_choices_streaming_and_not(real_server: RealServer) -> None:
    client = real_server.client()
    messages = [{"role": "user", "content": "Invent a name for a pet dragon. Just the name."}]
    args: dict[str, Any] = {
        "model": real_server.alias,
        "messages": messages,
        "temperature": 1.0,
        "max_tokens": 12,
        "seed": 11,
    }
    single = client.chat.completions.create(**args)
    done = client.chat.completions.create(n=3, **args)
    assert [c.index for c in done.choices] == [0, 1, 2]
    texts = [c.message.content or "" for c in done.choices]
    assert all(texts)
    assert len(set(texts)) >= 2, texts  # each choice draws with its own seed
    assert done.usage is not None
    assert single.usage is not None
    assert done.usage.prompt_tokens == single.usage.prompt_tokens
    assert done.usage.completion_tokens >= 3
    chunks = list(
        client.chat.completions.create(
            n=3, stream=True, stream_options={"include_usage": True}, **args
        )
    )
    streamed: Counter[int] = Counter()
    finishes = set()
    for chunk in chunks:
        for choice in chunk.choices:
            streamed[choice.index] += len(choice.delta.content or "")
            if choice.finish_reason:
                finishes.add(choice.index)
    assert set(streamed) == {0, 1, 2}
    assert finishes == {0, 1, 2}
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.prompt_tokens == single.usage.prompt_tokens
