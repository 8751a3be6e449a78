"""Tool calls in generated text: found while streaming, settled at the end.

Each parser reads one model family's call format from text fed as it is generated and
reports `ParseEvent`s: text outside calls, and calls as they open, stream their
arguments and close. The parse at a call's end is authoritative: a call that does not
parse, or names a tool that was not offered, becomes text again. `detect_parser` picks
the format from a model's chat template; `make_parser` builds a parser for it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Protocol

from mlxcel.respond.tool_parsers.base import Schemas
from mlxcel.respond.tool_parsers.end_parse import FunctionaryToolParser, PythonicToolParser
from mlxcel.respond.tool_parsers.events import (
    CallArguments,
    CallClosed,
    CallDropped,
    CallOpened,
    ParseEvent,
    TextPiece,
    fallback_call,
    parse_call,
    partial_suffix,
)
from mlxcel.respond.tool_parsers.hermes import HermesToolParser
from mlxcel.respond.tool_parsers.llama3 import Llama3JsonToolParser
from mlxcel.respond.tool_parsers.mistral import MistralToolParser
from mlxcel.respond.tool_parsers.qwen3_coder import Qwen3CoderToolParser

__all__ = [
    "PARSERS",
    "CallArguments",
    "CallClosed",
    "CallDropped",
    "CallOpened",
    "FunctionaryToolParser",
    "HermesToolParser",
    "Llama3JsonToolParser",
    "MistralToolParser",
    "ParseEvent",
    "PythonicToolParser",
    "Qwen3CoderToolParser",
    "TextPiece",
    "ToolParser",
    "detect_parser",
    "fallback_call",
    "make_parser",
    "parse_call",
    "partial_suffix",
]


class ToolParser(Protocol):
    def feed(self, text: str) -> list[ParseEvent]:
        """Events for the next piece of generated text."""
        ...

    def finish(self, *, cut: bool = False) -> list[ParseEvent]:
        """The closing events, once generation has ended.

        `cut`: it ended at its token budget, so a call still open was cut short. The
        `<tool_call>` forms (Hermes, Qwen3-Coder) drop such a call unless it parses
        whole, so its markup never becomes text; the other forms read what is left as
        at any other end."""
        ...

    @property
    def text(self) -> str:
        """All text outside parsed calls."""
        ...


ParserFactory = Callable[[frozenset[str], Schemas | None], ToolParser]

PARSERS: Mapping[str, ParserFactory] = {
    "hermes": HermesToolParser,
    "mistral": MistralToolParser,
    "llama3_json": Llama3JsonToolParser,
    "qwen3_coder": Qwen3CoderToolParser,
    "functionary": FunctionaryToolParser,
    "pythonic": PythonicToolParser,
}
"""Tool-call formats by name; each builds a parser from the offered tools' names and
their parameter schemas (tool name to JSON-schema `parameters`)."""

_MODEL_TYPES: Mapping[str, str] = {
    "mistral": "mistral",
    "mixtral": "mistral",
    "mistral3": "mistral",
    "llama": "llama3_json",
    "llama4": "pythonic",
    "qwen3_moe": "qwen3_coder",
}
"""Hugging Face `model_type`s whose format is known when the template says nothing."""

_PYTHONIC = re.compile(r"\[func_name\d*\(")


def make_parser(kind: str, names: frozenset[str], parameters: Schemas | None = None) -> ToolParser:
    """A parser for the `kind` format (a key of `PARSERS`)."""
    try:
        factory = PARSERS[kind]
    except KeyError:
        raise ValueError(
            f"unknown tool-call format {kind!r}; known: {', '.join(PARSERS)}"
        ) from None
    return factory(names, parameters)


def detect_parser(chat_template: str | None, model_type: str | None = None) -> str:
    """The tool-call format a chat template teaches (a key of `PARSERS`).

    The template's own markup decides; the model type is a hint only when the template
    shows none; the default is the Hermes form."""
    template = chat_template or ""
    if "<function=" in template and "<parameter=" in template:
        return "qwen3_coder"
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if _PYTHONIC.search(template):
        return "pythonic"
    if "<function=" in template:
        return "functionary"
    llama3 = "<|eot_id|>" in template or "ipython" in template
    if "<|python_tag|>" in template or (llama3 and '"parameters"' in template):
        return "llama3_json"
    return _MODEL_TYPES.get(model_type or "", "hermes")
