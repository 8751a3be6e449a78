"""The response builder: how a response ends (finish reasons, interrupts, failures),
its usage and its log-probabilities (checked with `replay`)."""

from __future__ import annotations

from typing import Any, Literal

import pytest

from mlxcel.generation import FinishReason, TokenStep
from mlxcel.items import (
    FunctionCall,
    Message,
    OutputText,
    Reasoning,
    ResponseError,
    Usage,
)
from mlxcel.respond.events import (
    ContentPartDone,
    FunctionCallArgumentsDone,
    OutputItemDone,
    OutputTextDelta,
    OutputTextDone,
    ReasoningTextDone,
    StreamError,
)
from mlxcel.respond.tool_parsers import (
    CallArguments,
    CallOpened,
    TextPiece,
)

from builder_stream import (
    F_CALL,
    G_CALL,
    HI,
    Script,
    builder,
    feed,
    hermes,
    kept,
    lp,
    plain,
    replay,
    statuses,
)

# --- how a response ends ---------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "status", "incomplete_reason"),
    [("stop", "completed", None), ("length", "incomplete", "max_output_tokens")],
)
def test_the_finish_reason_sets_the_status(
    reason: FinishReason, status: str, incomplete_reason: str | None
) -> None:
    b = plain()
    events = feed(b, ["one", " two"])
    closing, record = b.finish(reason)
    [item] = replay(events + closing)
    assert isinstance(item.done, Message)
    assert item.done.status == status
    assert record.status == status
    assert record.incomplete_reason == incomplete_reason
    assert (record.completed_at is not None) == (reason == "stop")
    assert record.output == (item.done,)


def test_a_length_stop_inside_a_call_drops_the_call_and_its_markup() -> None:
    b = plain(tools=hermes())
    events = feed(b, [HI, F_CALL[0]])
    closing, record = b.finish("length")
    items = replay(events + closing)
    assert statuses(items) == [(Message, "completed"), (FunctionCall, "incomplete")]
    assert record.status == "incomplete"
    assert record.incomplete_reason == "max_output_tokens"
    # The call was cut short: it is not kept, and its markup is no text either.
    assert not any(isinstance(i, FunctionCall) for i in record.output)
    assert record.output_text == HI
    assert not any(isinstance(e, OutputTextDelta) and "<tool_call>" in e.delta for e in closing)
    kept(items, record)


def test_a_length_stop_right_after_a_call_tag_answers_with_an_empty_message() -> None:
    b = plain(tools=hermes())
    events = feed(b, ["<tool_call>"])
    closing, record = b.finish("length")
    assert statuses(replay(events + closing)) == [(Message, "incomplete")]
    assert record.output_text == ""


def interrupt_cases() -> list[Any]:
    return [
        pytest.param("cancelled", None, id="cancelled"),
        pytest.param("incomplete", "server_shutdown", id="shutdown"),
    ]


@pytest.mark.parametrize(("status", "reason"), interrupt_cases())
def test_an_interrupt_mid_message_closes_it_once_and_keeps_it(
    status: Literal["cancelled", "incomplete"], reason: str | None
) -> None:
    b = plain()
    events = b.start() + feed(b, ["Hel", "lo"])
    closing, record = b.interrupt(status, reason=reason)
    [item] = replay(events + closing)
    assert [type(e) for e in closing] == [OutputTextDone, ContentPartDone, OutputItemDone]
    assert isinstance(item.done, Message)
    assert (item.done.text, item.done.status) == ("Hello", "incomplete")
    assert record.status == status
    assert record.incomplete_reason == reason
    assert record.completed_at is None
    assert record.output == (item.done,)
    assert record.usage == Usage(7, 2)
    # Once ended, it stays as it is: no second set of closing events.
    assert b.interrupt("cancelled") == ([], record)
    assert b.cancel() == record


@pytest.mark.parametrize(("status", "reason"), interrupt_cases())
def test_an_interrupt_mid_call_closes_it_once_with_what_was_streamed(
    status: Literal["cancelled", "incomplete"], reason: str | None
) -> None:
    b = plain(tools=hermes())
    events = feed(b, [HI, *F_CALL, G_CALL[0]])
    closing, record = b.interrupt(status, reason=reason)
    items = replay(events + closing)
    assert [type(e) for e in closing] == [FunctionCallArgumentsDone, OutputItemDone]
    call = items[2].done
    assert isinstance(call, FunctionCall)
    assert (call.name, call.arguments, call.status) == ("g", '{"b":', "incomplete")
    assert (record.status, record.incomplete_reason) == (status, reason)
    # The finished call is kept; the one cut short is closed in the stream but not kept:
    # its arguments are not JSON, so it is not a call the client could answer.
    assert record.output == (items[0].done, items[1].done)
    kept(items, record)


def test_an_interrupt_closes_an_open_message_and_an_open_call_each_once(
    script: Script,
) -> None:
    script[:] = [[CallOpened(0, "f"), CallArguments(0, "{")], [TextPiece("meanwhile")]]
    b = builder()
    events = b.start() + feed(b, ["a", "b"])
    closing, record = b.interrupt("cancelled")
    items = replay(events + closing)
    assert [type(i.done) for i in items] == [FunctionCall, Message]
    assert sum(isinstance(e, OutputItemDone) for e in closing) == 2
    assert record.output == (items[1].done,)


def test_an_interrupt_mid_reasoning_closes_the_trace_once_and_keeps_it() -> None:
    b = plain(reasoning_opened=True)
    events = feed(b, ["still", " thinking"])
    closing, record = b.interrupt("cancelled")
    [item] = replay(events + closing)
    assert [type(e) for e in closing] == [ReasoningTextDone, OutputItemDone]
    assert isinstance(item.done, Reasoning)
    assert item.done.text == "still thinking"
    assert record.output == (item.done,)
    assert record.usage == Usage(7, 2, 0, 2)


def test_an_interrupt_drops_text_held_as_a_possible_call() -> None:
    b = plain(tools=hermes())
    events = feed(b, ['{"name": "f"'])
    closing, record = b.interrupt("cancelled")
    assert events == closing == []
    assert (record.status, record.output) == ("cancelled", ())


def test_an_interrupt_before_any_output_has_nothing_to_close() -> None:
    b = plain()
    b.start()
    assert b.interrupt("incomplete", reason="server_shutdown")[0] == []
    assert b.record.status == "incomplete"
    assert b.record.usage == Usage(7, 0)


def test_a_finished_response_is_not_interrupted() -> None:
    b = plain()
    feed(b, ["done"])
    _, record = b.finish("stop")
    assert b.interrupt("incomplete", reason="server_shutdown") == ([], record)
    assert b.cancel() is record


def test_a_failure_drops_the_partial_output_but_counts_its_tokens() -> None:
    b = plain()
    feed(b, [TokenStep(1, 0, "par", cached_tokens=4), TokenStep(1, 1, "tial")])
    events, record = b.fail("server_error", "boom")
    rid = record.id
    assert events == [StreamError(rid, "server_error", "boom")]
    assert (record.status, record.output) == ("failed", ())
    assert record.error == ResponseError("server_error", "boom")
    assert record.usage == Usage(7, 2, 4, 0)


# --- usage and log-probabilities -------------------------------------------------


def test_usage_counts_every_step_and_the_cache_hits_of_the_first() -> None:
    b = plain()
    feed(
        b,
        [
            TokenStep(1, 0, "a", cached_tokens=5, cache_write_tokens=2),
            TokenStep(1, 1, ""),  # a token whose text is not decodable yet
            TokenStep(1, 2, "b", cached_tokens=6, cache_write_tokens=1),  # only a first step
        ],
    )
    _, record = b.finish("stop")
    assert record.usage == Usage(
        input_tokens=7, output_tokens=3, cached_tokens=5, cache_write_tokens=2
    )
    assert record.usage.total_tokens == 10


@pytest.mark.parametrize(
    ("pieces", "reasoning"),
    [
        # Tokens before the reply shows whether it opens a trace (nothing decodable yet,
        # layout, a prefix of `<think>`) are counted once it does, and only if it does.
        pytest.param(["", "\n", "<", "b>hi</b>"], 0, id="answer"),
        pytest.param(["", "\n", "<", "think>", "x", "</think>", "y"], 6, id="trace"),
        pytest.param(["", "<"], 0, id="undecided-at-the-end"),
    ],
)
def test_reasoning_tokens_are_the_tokens_of_the_trace(pieces: list[str], reasoning: int) -> None:
    b = plain()
    feed(b, pieces)
    _, record = b.finish("stop")
    assert record.usage == Usage(7, len(pieces), 0, reasoning)


def test_logprobs_ride_on_the_deltas_and_the_part() -> None:
    b = plain()
    steps = [
        TokenStep(1, 0, "Hel", logprob=lp("Hel", -0.5)),
        TokenStep(1, 1, "", logprob=lp("l", -1.0)),  # released with the next token's text
        TokenStep(1, 2, "lo!", logprob=lp("o!", -2.0)),
    ]
    events = feed(b, steps)
    closing, record = b.finish("stop")
    [item] = replay(events + closing)
    deltas = [e for e in events if isinstance(e, OutputTextDelta)]
    assert [(d.delta, [x.token for x in d.logprobs]) for d in deltas] == [
        ("Hel", ["Hel"]),
        ("lo!", ["l", "o!"]),
    ]
    assert isinstance(item.done, Message)
    [part] = item.done.content
    assert part == OutputText("Hello!", tuple(s.logprob for s in steps if s.logprob))
    assert record.output == (item.done,)


def test_without_logprobs_parts_carry_none() -> None:
    b = plain()
    events = feed(b, ["a", "b"])
    closing, _ = b.finish("stop")
    [item] = replay(events + closing)
    assert item.logprobs == []
    assert all(not e.logprobs for e in events if isinstance(e, OutputTextDelta))


def test_reasoning_tokens_carry_no_output_logprobs() -> None:
    b = plain(reasoning_opened=True)
    steps = [TokenStep(1, 0, "hmm", logprob=lp("hmm", -1.0))]
    steps += [TokenStep(1, 1, "</think>Yes", logprob=lp("</think>Yes", -2.0))]
    events = feed(b, steps)
    closing, record = b.finish("stop")
    items = replay(events + closing)
    assert [x.token for x in items[1].logprobs] == ["</think>Yes"]
    assert record.output_text == "Yes"


def test_logprobs_are_kept_when_tools_are_offered() -> None:
    b = plain(tools=hermes())
    steps = [
        TokenStep(1, 0, "Hel", logprob=lp("Hel", -0.5)),
        TokenStep(1, 1, "lo", logprob=lp("lo", -1.0)),
    ]
    events = feed(b, steps)
    closing, _ = b.finish("stop")
    [item] = replay(events + closing)
    assert [x.token for x in item.logprobs] == ["Hel", "lo"]


def test_the_token_closing_the_trace_carries_no_output_logprob() -> None:
    b = plain(reasoning_opened=True)
    steps = [
        TokenStep(1, 0, "hmm", logprob=lp("hmm", -1.0)),
        TokenStep(1, 1, "</think>", logprob=lp("</think>", -0.1)),
        TokenStep(1, 2, "Yes", logprob=lp("Yes", -2.0)),
    ]
    events = feed(b, steps)
    closing, record = b.finish("stop")
    items = replay(events + closing)
    assert "".join(x.token for x in items[1].logprobs) == record.output_text == "Yes"


def test_a_closing_tag_split_over_tokens_and_its_layout_carry_no_output_logprob() -> None:
    b = plain(reasoning_opened=True)
    texts = ["hmm", "</", "think>", "\n\n", "Yes"]
    events = feed(b, scored(texts))
    closing, record = b.finish("stop")
    items = replay(events + closing)
    assert [x.token for x in items[1].logprobs] == ["Yes"]
    assert record.output_text == "Yes"


def test_tokens_swallowed_into_a_call_carry_no_message_logprob() -> None:
    b = plain(tools=hermes())
    texts = ["Sure", ", ", *F_CALL, " done"]
    events = feed(b, scored(texts))
    closing, record = b.finish("stop")
    items = replay(events + closing)
    messages = [i for i in items if isinstance(i.done, Message)]
    assert [i.done.status for i in items if isinstance(i.done, FunctionCall)] == ["completed"]
    assert [x.token for m in messages for x in m.logprobs] == ["Sure", ", ", " done"]
    assert record.output_text == "Sure,  done"


def test_text_held_as_a_possible_call_keeps_its_logprobs() -> None:
    b = plain(tools=hermes())
    texts = ["{not", " a call"]
    events = feed(b, scored(texts))
    closing, record = b.finish("stop")
    [item] = replay(events + closing)
    assert [x.token for x in item.logprobs] == texts
    assert record.output_text == "{not a call"


def scored(texts: list[str]) -> list[TokenStep]:
    return [TokenStep(1, i, t, logprob=lp(t, -1.0)) for i, t in enumerate(texts)]
