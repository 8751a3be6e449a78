"""Conversation items → chat-template messages → prompt tokens.

`to_chat` is model-independent: it maps Responses items onto the message dicts chat
templates read (system/user/assistant/tool, `tool_calls`). `TemplateCodec` applies a
tokenizer's chat template; when a template accepts only one leading system message it
retries with every system message merged into it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from mlxcel.errors import InvalidRequest
from mlxcel.items import FunctionCall, FunctionCallOutput, Item, Message, Reasoning, replay
from mlxcel.model.constrained import GrammarCompiler, compile_schema

ChatMessage = dict[str, Any]


def to_chat(instructions: str | None, items: Sequence[Item]) -> list[ChatMessage]:
    """The chat messages for `instructions` followed by `items` (a compaction standing
    in for the items before it)."""
    messages: list[ChatMessage] = []
    pending_reasoning = ""
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for item in replay(items):
        match item:
            case Message(role=role):
                chat_role = "system" if role == "developer" else role
                messages.append({"role": chat_role, "content": item.text})
                if role == "assistant" and pending_reasoning:
                    messages[-1]["reasoning_content"] = pending_reasoning
                pending_reasoning = ""
            case FunctionCall(call_id=call_id, arguments=arguments):
                call = {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": item.flat_name, "arguments": _arguments(arguments)},
                }
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant":
                    last.setdefault("tool_calls", []).append(call)
                else:
                    messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            case FunctionCallOutput(call_id=call_id, output=output):
                messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
            case Reasoning(text=text):
                pending_reasoning = text  # templates that keep traces read it from the turn
    if not any(m["role"] in ("user", "tool") for m in messages):
        raise InvalidRequest("The input must contain at least one user message.", param="input")
    return messages


def _arguments(arguments: str) -> Any:
    """Templates expect parsed arguments (they `tojson` them); keep text that isn't JSON."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def merge_system(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """All system messages merged, in order, into one leading system message."""
    system = [m["content"] for m in messages if m["role"] == "system" and m["content"]]
    rest = [m for m in messages if m["role"] != "system"]
    return ([{"role": "system", "content": "\n\n".join(system)}] if system else []) + rest


class ChatTokenizer(Protocol):
    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


HERMES_TAGS = ("<tool_call>", "</tool_call>")


class TemplateCodec:
    """Renders with the tokenizer's chat template; used off the MLX thread."""

    def __init__(self, tokenizer: ChatTokenizer, grammars: GrammarCompiler | None = None) -> None:
        self._tokenizer = tokenizer
        self._grammars = grammars
        # The Hermes call tags as token ids, when the tokenizer keeps each one whole.
        tags = [tokenizer.encode(tag, add_special_tokens=False) for tag in HERMES_TAGS]
        whole = all(len(ids) == 1 for ids in tags)
        self._call_tokens = (tags[0][0], tags[1][0]) if whole else None

    def opens_reasoning(self, template_kwargs: Mapping[str, Any] | None = None) -> bool:
        try:
            probe = self._apply([{"role": "user", "content": "x"}], None, template_kwargs)
        except Exception:  # a template this strict is reported per request instead
            return False
        return probe.rstrip(" ").endswith("<think>\n")

    def compile_schema(self, schema: Mapping[str, Any]) -> str:
        if self._grammars is None:
            return compile_schema(schema)
        return self._grammars.compile_schema(schema)

    def compile_call(self, schema: Mapping[str, Any], parser: str) -> str:
        """In the Hermes form when the model writes it with whole `<tool_call>` tokens."""
        if parser != "hermes" or self._grammars is None or self._call_tokens is None:
            return self.compile_schema(schema)
        return self._grammars.compile_tagged_call(schema, *self._call_tokens)

    def render(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[dict[str, Any]] | None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        try:
            text = self._apply(list(messages), tools, template_kwargs)
        except Exception as first:
            merged = merge_system(messages)
            if merged == list(messages):
                raise InvalidRequest(
                    f"The chat template rejected the input: {first}",
                    param="input",
                    code="invalid_prompt",
                ) from first
            try:
                text = self._apply(merged, tools, template_kwargs)
            except Exception as exc:
                raise InvalidRequest(
                    f"The chat template rejected the input: {exc}",
                    param="input",
                    code="invalid_prompt",
                ) from exc
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def _apply(
        self,
        messages: list[ChatMessage],
        tools: Sequence[dict[str, Any]] | None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        text = self._tokenizer.apply_chat_template(
            messages,
            tools=list(tools) if tools else None,
            add_generation_prompt=True,
            tokenize=False,
            **dict(template_kwargs or {}),
        )
        return str(text)
