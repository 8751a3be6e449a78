"""The input items at the edge: pydantic models of messages, function and custom tool
calls and their outputs, reasoning, compaction items, item references and content parts,
and their conversion into plain `mlxcel.items` data (`to_items`, `to_entries`).

The request bodies that carry these items are `http/schemas.py`'s.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator

from mlxcel.errors import InvalidRequest
from mlxcel.http.files import InputFilePart
from mlxcel.http.objects import REASONING_PREFIX
from mlxcel.items import (
    Compaction,
    ContentPart,
    FunctionCall,
    FunctionCallOutput,
    InputImage,
    InputText,
    Item,
    ItemReference,
    Message,
    OutputText,
    Reasoning,
    Refusal,
    new_id,
    parts_text,
)


class _Model(BaseModel):
    # Clients send fields newer than any server; unknown ones are accepted and ignored.
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


class InputTextPart(_Model):
    type: Literal["input_text"]
    text: str


class OutputTextPart(_Model):
    type: Literal["output_text"]
    text: str


class RefusalPart(_Model):
    type: Literal["refusal"]
    refusal: str


class InputImagePart(_Model):
    """An image by URL (a data URL too) or file id; kept as sent."""

    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["low", "high", "auto", "original"] | None = None

    @model_validator(mode="after")
    def _named(self) -> InputImagePart:
        if self.image_url is None and self.file_id is None:
            raise ValueError("an input_image needs an 'image_url' or a 'file_id'")
        return self


ContentPartIn = Annotated[
    InputTextPart | OutputTextPart | RefusalPart | InputImagePart | InputFilePart,
    Field(discriminator="type"),
]
OutputPartIn = Annotated[
    InputTextPart | InputImagePart | InputFilePart, Field(discriminator="type")
]


class MessageIn(_Model):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPartIn]
    id: str | None = None


class FunctionCallIn(_Model):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    namespace: str | None = None


class FunctionCallOutputIn(_Model):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[OutputPartIn]
    id: str | None = None


class CustomToolCallIn(_Model):
    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str
    id: str | None = None
    namespace: str | None = None


class CustomToolCallOutputIn(_Model):
    type: Literal["custom_tool_call_output"]
    call_id: str
    output: str | list[OutputPartIn]
    id: str | None = None


class ReasoningContentIn(_Model):
    type: Literal["reasoning_text"]
    text: str


class ReasoningIn(_Model):
    type: Literal["reasoning"]
    id: str | None = None
    content: list[ReasoningContentIn] | None = None
    encrypted_content: str | None = None
    """The trace, when this server wrote it (`include: ["reasoning.encrypted_content"]`);
    another server's opaque blob carries nothing this model can read and is ignored."""

    @property
    def trace(self) -> str:
        """The trace's text: from `content`, else from an `encrypted_content` of ours."""
        text = "".join(c.text for c in self.content or [])
        blob = self.encrypted_content or ""
        if text or not blob.startswith(REASONING_PREFIX):
            return text
        encoded = blob[len(REASONING_PREFIX) :]
        try:
            return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
        except (ValueError, binascii.Error):
            return ""


def _default_message_type(value: Any) -> Any:
    """An item with a `role` and no `type` is a message."""
    if isinstance(value, dict) and "type" not in value and "role" in value:
        return {**value, "type": "message"}
    return value


class ItemReferenceIn(_Model):
    """`{"type": "item_reference", "id": …}`: a stored item named by id."""

    type: Literal["item_reference"]
    id: str = Field(min_length=1, max_length=256)


def _default_item_type(value: Any) -> Any:
    """A message without `type`, or an item reference (whose `type` may be left out or
    null)."""
    reference = isinstance(value, dict) and "id" in value and "role" not in value
    if reference and value.get("type") is None:
        return {**value, "type": "item_reference"}
    return _default_message_type(value)


_PlainItem = Annotated[
    MessageIn
    | FunctionCallIn
    | FunctionCallOutputIn
    | CustomToolCallIn
    | CustomToolCallOutputIn
    | ReasoningIn,
    Field(discriminator="type"),
]


class CompactionContent(_Model):
    """What a compaction item's `encrypted_content` holds (base64url JSON)."""

    summary: str
    preserved: list[Annotated[_PlainItem, BeforeValidator(_default_message_type)]]


# Validation holds the interpreter for its whole run (some 4 s per million items on a
# slow machine), so the number of items and parts is checked on the raw JSON first. No
# context window holds this many turns: at 100,000 the work stays a fraction of a second.
MAX_INPUT_PARTS = 100_000


def check_parts(raw_items: Any, param: str = "input") -> None:
    """400 for a raw item list with more items and content parts than `MAX_INPUT_PARTS`
    (one pass over the top level: each item's own part list is only measured)."""
    if not isinstance(raw_items, list):
        return  # a string, or the wrong type, which validation reports
    count = len(raw_items)
    for item in raw_items:
        if count > MAX_INPUT_PARTS:
            break
        if isinstance(item, dict):
            for key in ("content", "output"):
                parts = item.get(key)
                count += len(parts) if isinstance(parts, list) else 0
    if count > MAX_INPUT_PARTS:
        raise InvalidRequest(
            f"Invalid '{param}': more than {MAX_INPUT_PARTS} items and content parts.",
            param=param,
            code="array_above_max_length",
        )


def _decode_content(value: Any) -> Any:
    if not isinstance(value, str):
        return value  # reported as the wrong type
    try:
        content = json.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
    except (ValueError, binascii.Error) as exc:
        raise ValueError("not the base64url JSON a compaction produced") from exc
    if isinstance(content, dict):
        check_parts(content.get("preserved"), "input")
    return content


class CompactionIn(_Model):
    type: Literal["compaction"]
    encrypted_content: Annotated[
        CompactionContent,
        BeforeValidator(_decode_content),
        # On the wire it is the string a compaction produced, not the object it decodes to.
        WithJsonSchema(
            {"type": "string", "description": "The `encrypted_content` a compaction produced."}
        ),
    ]
    id: str | None = None


_TaggedItem = Annotated[
    MessageIn
    | FunctionCallIn
    | FunctionCallOutputIn
    | CustomToolCallIn
    | CustomToolCallOutputIn
    | ReasoningIn
    | CompactionIn,
    Field(discriminator="type"),
]
InputItemIn = Annotated[_TaggedItem, BeforeValidator(_default_message_type)]
_ResponseInputItem = Annotated[
    MessageIn
    | FunctionCallIn
    | FunctionCallOutputIn
    | CustomToolCallIn
    | CustomToolCallOutputIn
    | ReasoningIn
    | CompactionIn
    | ItemReferenceIn,
    Field(discriminator="type"),
]
ResponseInputItemIn = Annotated[_ResponseInputItem, BeforeValidator(_default_item_type)]
"""A create request's input item: any item, or a reference to a stored one."""
# The tags pydantic puts in error locations between field names.
ITEM_TAGS = frozenset(
    {
        "message",
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "reasoning",
        "compaction",
        "input_text",
        "output_text",
        "refusal",
        "reasoning_text",
        "input_image",
        "input_file",
        "item_reference",
    }
)


def _part(
    part: InputTextPart | OutputTextPart | RefusalPart | InputImagePart | InputFilePart,
) -> ContentPart:
    match part:
        case InputFilePart(text=text):
            return InputText(text)
        case InputImagePart(image_url=url, file_id=file_id, detail=detail):
            return InputImage(url, file_id, detail or "auto")
        case InputTextPart(text=text):
            return InputText(text)
        case OutputTextPart(text=text):
            return OutputText(text)
        case RefusalPart(refusal=refusal):
            return Refusal(refusal)
    raise AssertionError(part)


InputItem = (
    MessageIn
    | FunctionCallIn
    | FunctionCallOutputIn
    | CustomToolCallIn
    | CustomToolCallOutputIn
    | ReasoningIn
    | CompactionIn
)


def to_entries(
    raw_input: str | Sequence[InputItem | ItemReferenceIn],
) -> tuple[tuple[Item, ...], tuple[ItemReference, ...]]:
    """A create request's input as items and, apart, the references among them (each
    with its place in the input)."""
    if isinstance(raw_input, str):
        return to_items(raw_input), ()
    references = tuple(
        ItemReference(raw.id, index)
        for index, raw in enumerate(raw_input)
        if isinstance(raw, ItemReferenceIn)
    )
    items = [raw for raw in raw_input if not isinstance(raw, ItemReferenceIn)]
    return to_items(items), references


def to_items(raw_input: str | Sequence[InputItem]) -> tuple[Item, ...]:
    """Request input as conversation items; items sent without an id get one."""
    if isinstance(raw_input, str):
        return (Message("user", (InputText(raw_input),), id=new_id("msg")),)
    items: list[Item] = []
    for raw in raw_input:
        match raw:
            case MessageIn(role=role, content=str(text), id=item_id):
                part: ContentPart = OutputText(text) if role == "assistant" else InputText(text)
                items.append(Message(role, (part,), id=item_id or new_id("msg")))
            case MessageIn(role=role, content=list(parts), id=item_id):
                content = tuple(_part(p) for p in parts)
                items.append(Message(role, content, id=item_id or new_id("msg")))
            case FunctionCallIn(call_id=call_id, name=name, arguments=arguments, id=item_id):
                item_id = item_id or new_id("fc")
                namespace = raw.namespace
                items.append(FunctionCall(call_id, name, arguments, item_id, namespace=namespace))
            case FunctionCallOutputIn(call_id=call_id, output=str(text), id=item_id):
                items.append(FunctionCallOutput(call_id, text, id=item_id or new_id("fco")))
            case FunctionCallOutputIn(call_id=call_id, output=list(output), id=item_id):
                sent = tuple(_part(p) for p in output)
                item_id = item_id or new_id("fco")
                items.append(FunctionCallOutput(call_id, parts_text(sent), item_id, sent))
            case CustomToolCallIn(call_id=call_id, name=name, input=text, id=item_id):
                item_id = item_id or new_id("ctc")
                namespace = raw.namespace
                items.append(
                    FunctionCall(call_id, name, text, item_id, namespace=namespace, custom=True)
                )
            case CustomToolCallOutputIn(call_id=call_id, output=str(text), id=item_id):
                item_id = item_id or new_id("ctco")
                items.append(FunctionCallOutput(call_id, text, item_id, custom=True))
            case CustomToolCallOutputIn(call_id=call_id, output=list(output), id=item_id):
                sent = tuple(_part(p) for p in output)
                item_id = item_id or new_id("ctco")
                items.append(
                    FunctionCallOutput(call_id, parts_text(sent), item_id, sent, custom=True)
                )
            case ReasoningIn(id=item_id):
                items.append(Reasoning(raw.trace, id=item_id or new_id("rs")))
            case CompactionIn(encrypted_content=content, id=item_id):
                preserved = to_items(content.preserved)
                items.append(Compaction(content.summary, preserved, id=item_id or new_id("cmp")))
    return tuple(items)
