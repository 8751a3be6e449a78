"""Chat-template messages → prompt tokens.

The messages come from preparation (`prepare/chat_messages.py` maps Responses items onto
the message dicts chat templates read). `TemplateCodec` applies a tokenizer's chat
template; when a template accepts only one leading system message it
retries with every system message merged into it. Text from the client never encodes as
control tokens: only the template's own markup does.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from tokenizers import Tokenizer

from mlxcel.errors import InvalidRequest
from mlxcel.generation import CustomGrammar
from mlxcel.model.grammar.constrained import GrammarCompiler, compile_schema
from mlxcel.model.grammar.tool_grammars import validate

ChatMessage = dict[str, Any]

log = logging.getLogger(__name__)


def merge_system(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """All system messages merged, in order, into one leading system message."""
    system = [m["content"] for m in messages if m["role"] == "system" and m["content"]]
    rest = [m for m in messages if m["role"] != "system"]
    return ([{"role": "system", "content": "\n\n".join(system)}] if system else []) + rest


class ChatTokenizer(Protocol):
    """What rendering needs of a tokenizer: its chat template and its encoder, so prompts are
    rendered and counted the same way whichever tokenizer a model brings."""

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
        self._guard = ControlTokenGuard.for_tokenizer(tokenizer)

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

    def compile_custom_tools(
        self,
        custom: Sequence[CustomGrammar],
        others: Sequence[str],
        parser: str,
        *,
        call_schema: Mapping[str, Any] | None = None,
        required: bool = False,
    ) -> str | None:
        """Enforced in the Hermes form with whole `<tool_call>` tokens (`tool_grammars`);
        elsewhere each grammar is only validated."""
        if self._grammars is None:
            for tool in custom:
                validate(tool, None)
            return None
        tokens = self._call_tokens if parser == "hermes" else None
        return self._grammars.compile_custom_tools(
            custom, others, tokens, call_schema=call_schema, required=required
        )

    def render(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[dict[str, Any]] | None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        if self._guard is not None and self._guard.finds_any([messages, tools]):
            # Client strings hold control-token text: render them as marks, encode as text.
            marks = self._guard.marks()
            marked = marks.apply(list(messages))
            marked_tools = marks.apply(list(tools)) if tools else None
            text = self._template(marked, marked_tools, template_kwargs)
            return marks.encode(text, self._tokenizer)
        text = self._template(messages, tools, template_kwargs)
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def encode(self, text: str) -> list[int]:
        # The client writes the whole prompt, so its control-token text is no forgery.
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def _template(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[dict[str, Any]] | None,
        template_kwargs: Mapping[str, Any] | None,
    ) -> str:
        """The rendered prompt text; a template that rejects the messages gets one retry
        with the system messages merged."""
        try:
            return self._apply(list(messages), tools, template_kwargs)
        except Exception as first:
            merged = merge_system(messages)
            if merged == list(messages):
                raise InvalidRequest(
                    f"The chat template rejected the input: {first}",
                    param="input",
                    code="invalid_prompt",
                ) from first
            try:
                return self._apply(merged, tools, template_kwargs)
            except Exception as exc:
                raise InvalidRequest(
                    f"The chat template rejected the input: {exc}",
                    param="input",
                    code="invalid_prompt",
                ) from exc

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


class ControlTokenGuard:
    """Finds control-token text (`<|im_end|>`, `<tool_call>`) in client strings and has it
    encoded as the plain text it is, so a client cannot forge a role or a turn's end.

    Control tokens are the tokenizer's special added tokens and its markup-like added ones
    (`<…>`); other added tokens (some tokenizers add runs of spaces) encode as usual.
    """

    def __init__(self, plain_ids: Mapping[str, Sequence[int]]) -> None:
        self.controls = tuple(sorted(plain_ids, key=len, reverse=True))  # longest match first
        self._plain = {text: list(ids) for text, ids in plain_ids.items()}
        self._index = {text: index for index, text in enumerate(self.controls)}
        self._find = re.compile("|".join(re.escape(text) for text in self.controls))

    @classmethod
    def for_tokenizer(cls, tokenizer: object) -> ControlTokenGuard | None:
        """None when the tokenizer is not backed by `tokenizers` or has no control tokens."""
        backend = tokenizer
        for _ in range(3):  # mlx-lm's wrapper → transformers' tokenizer → `tokenizers`
            if isinstance(backend, Tokenizer):
                break
            backend = getattr(backend, "_tokenizer", None)
        if not isinstance(backend, Tokenizer):
            return None
        controls = {
            token.content: token_id
            for token_id, token in backend.get_added_tokens_decoder().items()
            if token.content
            and (token.special or (token.content[0] == "<" and token.content[-1] == ">"))
        }
        return cls(_plain_ids(backend, controls)) if controls else None

    def finds_any(self, value: object) -> bool:
        """Whether any string in `value` (nested lists and dicts, keys too) holds one."""
        if isinstance(value, str):
            return self._find.search(value) is not None
        if isinstance(value, Mapping):
            return any(self.finds_any(k) or self.finds_any(v) for k, v in value.items())
        if isinstance(value, list | tuple):
            return any(self.finds_any(v) for v in value)
        return False

    def marks(self) -> ControlMarks:
        return ControlMarks(self, secrets.token_hex(8))

    def replace(self, text: str, mark: Callable[[int], str]) -> str:
        return self._find.sub(lambda found: mark(self._index[found.group()]), text)

    def plain_ids(self, index: int) -> list[int]:
        return self._plain[self.controls[index]]


def _plain_ids(backend: Tokenizer, controls: Mapping[str, int]) -> dict[str, list[int]]:
    """Each control token's text as ordinary tokens, from a copy of the tokenizer without
    its added tokens (the shared one is never switched, since other threads use it)."""
    try:
        config = json.loads(backend.to_str())
        config["added_tokens"] = []
        plain = Tokenizer.from_str(json.dumps(config))
    except Exception as exc:  # then each character is spelled alone, never as a control
        log.warning("could not copy the tokenizer without its added tokens: %s", exc)
        plain = backend
    control_ids = set(controls.values())
    found: dict[str, list[int]] = {}
    for text in controls:
        ids = plain.encode(text, add_special_tokens=False).ids
        if plain is backend or control_ids.intersection(ids):
            ids = [i for char in text for i in plain.encode(char, add_special_tokens=False).ids]
        found[text] = list(ids)
    return found


class ControlMarks:
    """One render's marks: each control-token text in client strings becomes a mark (ASCII
    letters and digits, so JSON-quoting templates keep it), unguessable by the client."""

    def __init__(self, guard: ControlTokenGuard, nonce: str) -> None:
        self._guard = guard
        self._prefix = f"mlxcel{nonce}x"
        self._split = re.compile(re.escape(self._prefix) + r"(\d+)x")

    def apply(self, value: Any) -> Any:
        """`value` with every control-token text in its strings replaced by its mark."""
        if isinstance(value, str):
            return self._guard.replace(value, lambda index: f"{self._prefix}{index}x")
        if isinstance(value, Mapping):
            return {self.apply(k): self.apply(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.apply(v) for v in value]
        return value

    def encode(self, text: str, tokenizer: ChatTokenizer) -> list[int]:
        """The rendered text's ids: the template's text as usual, each mark as plain text."""
        ids: list[int] = []
        for index, piece in enumerate(self._split.split(text)):
            if index % 2:
                ids += self._guard.plain_ids(int(piece))
            elif piece:
                ids += tokenizer.encode(piece, add_special_tokens=False)
        return ids
