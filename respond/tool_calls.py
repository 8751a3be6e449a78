"""The tool calls of one response: opened, streamed and closed as its tool-call parser
reports them, as `function_call` or `custom_tool_call` items and their stream events.

The `ResponseBuilder` owns the output list and the message text; this part owns the open
calls. Calls the response was not offered, and calls beyond the first when
`parallel_tool_calls` is off, or beyond `max_tool_calls`, are ignored: their later events change nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from mlxcel.generation import ToolUse
from mlxcel.items import FunctionCall, Item, custom_input, new_id
from mlxcel.respond.custom_input import InputDecoder
from mlxcel.respond.events import (
    CustomToolCallInputDelta,
    CustomToolCallInputDone,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    OutputItemAdded,
    OutputItemDone,
    ResponseEvent,
)
from mlxcel.respond.tool_parsers import CallArguments, CallClosed, CallDropped

Status = Literal["completed", "incomplete"]


@dataclasses.dataclass
class _OpenCall:
    item: FunctionCall
    index: int
    sent: str = ""
    decoder: InputDecoder | None = None  # a custom tool's input, decoded as it streams
    streamed: str = ""  # the input sent so far


class ToolCalls:
    """The tool calls of one response as they are parsed: each call's item opened, its
    arguments streamed and closed, in the order the events must go out."""

    def __init__(self, response_id: str, tools: ToolUse, output: list[Item | None]) -> None:
        self._id = response_id  # every event names its response
        self._tools = tools
        self._output = output  # the builder's: None marks a slot whose item is still open
        self._calls: dict[int, _OpenCall] = {}
        self._opened: set[int] = set()  # every call index seen opening
        self._ignored: set[int] = set()  # calls beyond the first when parallel_tool_calls is off

    def accepts(self, index: int, name: str) -> bool:
        """Whether the call the parser opens at `index` is one this response shows."""
        if index in self._opened:
            return False  # an index opens once; its later events belong to the first
        self._opened.add(index)
        if name not in self._tools.names or self._one_call_made():
            self._ignored.add(index)  # not offered, or parallel_tool_calls is off
            return False
        return True

    def spare_index(self) -> int:
        """A call index outside the parser's own numbering."""
        return min(self._opened, default=0) - 1

    def open(self, index: int, name: str) -> list[ResponseEvent]:
        """Open an accepted call as the next output item."""
        custom = name in self._tools.custom
        namespace, name = self._tools.namespaces.get(name, (None, name))
        item_id = new_id("ctc" if custom else "fc")
        item = FunctionCall(new_id("call"), name, "", item_id, "in_progress", namespace, custom)
        self._calls[index] = _OpenCall(
            item, len(self._output), decoder=InputDecoder() if custom else None
        )
        self._output.append(None)
        return [OutputItemAdded(self._id, self._calls[index].index, item)]

    def parsed(self, event: CallArguments | CallClosed | CallDropped) -> list[ResponseEvent]:
        if event.index in self._ignored or event.index not in self._calls:
            return []  # not a call this response shows (or one that already ended)
        if isinstance(event, CallArguments):
            return self._arguments(event.index, event.delta)
        if isinstance(event, CallClosed):
            return self._close(event.index, event.arguments, "completed")
        return self._close(event.index, self._calls[event.index].sent, "incomplete")

    def close_all(self) -> list[ResponseEvent]:
        """Close the calls still open as they stand (`incomplete`)."""
        events: list[ResponseEvent] = []
        for index in sorted(self._calls):
            events += self._close(index, self._calls[index].sent, "incomplete")
        return events

    def _one_call_made(self) -> bool:
        """Another call would break `parallel_tool_calls: false` or `max_tool_calls`."""
        cap = 1 if not self._tools.parallel else self._tools.max_calls
        if cap is None:
            return False
        made = len(self._calls) + sum(isinstance(i, FunctionCall) for i in self._output)
        return made >= cap

    def _arguments(self, index: int, delta: str) -> list[ResponseEvent]:
        call = self._calls[index]
        call.sent += delta
        assert call.item.id is not None
        if call.decoder is None:
            return [FunctionCallArgumentsDelta(self._id, call.item.id, call.index, delta)]
        piece = call.decoder.feed(delta)
        call.streamed += piece
        return (
            [CustomToolCallInputDelta(self._id, call.item.id, call.index, piece)] if piece else []
        )

    def _close(self, index: int, arguments: str, status: Status) -> list[ResponseEvent]:
        call = self._calls.pop(index)
        assert call.item.id is not None
        if call.decoder is not None:
            text = custom_input(arguments) if status == "completed" else call.streamed
            return self._close_custom(call, text, status)
        events: list[ResponseEvent] = []
        if arguments.startswith(call.sent) and len(arguments) > len(call.sent):
            rest = arguments[len(call.sent) :]
            events.append(FunctionCallArgumentsDelta(self._id, call.item.id, call.index, rest))
        item = dataclasses.replace(call.item, arguments=arguments, status=status)
        if status == "completed":
            self._output[call.index] = item
        events.append(FunctionCallArgumentsDone(self._id, call.item.id, call.index, arguments))
        events.append(OutputItemDone(self._id, call.index, item))
        return events

    def _close_custom(self, call: _OpenCall, text: str, status: Status) -> list[ResponseEvent]:
        """A `custom_tool_call`: its input is the string the model wrote as `input`."""
        assert call.item.id is not None
        item = dataclasses.replace(call.item, arguments=text, status=status)
        if status == "completed":
            self._output[call.index] = item
        events: list[ResponseEvent] = []
        rest = text[len(call.streamed) :] if text.startswith(call.streamed) else ""
        if rest:  # what the decoder could not stream (the end's parse is authoritative)
            events.append(CustomToolCallInputDelta(self._id, call.item.id, call.index, rest))
        events.append(CustomToolCallInputDone(self._id, call.item.id, call.index, text))
        events.append(OutputItemDone(self._id, call.index, item))
        return events
