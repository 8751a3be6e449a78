"""Conversation items: the nouns every layer speaks.

Input items arrive from clients, output items leave in responses, and stored output
items come back as input along `previous_response_id` chains, so one set of frozen
dataclasses serves all three. Validation happens at the HTTP edge; these are plain data.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, TypeAlias

Role: TypeAlias = Literal["user", "assistant", "system", "developer"]
ItemStatus: TypeAlias = Literal["in_progress", "completed", "incomplete"]
ResponseStatus: TypeAlias = Literal[
    "queued", "in_progress", "completed", "incomplete", "failed", "cancelled"
]
JsonValue: TypeAlias = dict[str, "JsonValue"] | list["JsonValue"] | str | int | float | bool | None


@dataclass(frozen=True, slots=True)
class InputText:
    text: str


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's log-probability, with its most likely alternatives."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class OutputText:
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class Refusal:
    refusal: str


IMAGE_PLACEHOLDER = "[image omitted: this model cannot see images]"


@dataclass(frozen=True, slots=True)
class InputImage:
    """An image part, kept as the client sent it (a URL, often a data URL, or a file
    id). A model without vision reads `IMAGE_PLACEHOLDER` in its place."""

    image_url: str | None = None
    file_id: str | None = None
    detail: str = "auto"


ContentPart: TypeAlias = InputText | OutputText | Refusal | InputImage


def parts_text(parts: Sequence[ContentPart]) -> str:
    """The parts as a text-only model reads them: refusals as text, each image as
    `IMAGE_PLACEHOLDER` on its own line."""
    chunks: list[str] = []
    for part in parts:
        match part:
            case InputImage():
                before = "\n" if chunks and not chunks[-1].endswith("\n") else ""
                chunks.append(f"{before}{IMAGE_PLACEHOLDER}\n")
            case Refusal(refusal=refusal):
                chunks.append(refusal)
            case InputText(text=text) | OutputText(text=text):
                chunks.append(text)
    return "".join(chunks).removesuffix("\n") if chunks else ""


def has_images(items: Sequence[Item]) -> bool:
    """Whether any message or call output among `items` carries an image part."""
    for item in items:
        parts = (
            item.content
            if isinstance(item, Message)
            else item.parts or ()
            if isinstance(item, FunctionCallOutput)
            else ()
        )
        if any(isinstance(p, InputImage) for p in parts):
            return True
    return False


@dataclass(frozen=True, slots=True)
class Message:
    role: Role
    content: tuple[ContentPart, ...]
    id: str | None = None
    status: ItemStatus = "completed"

    @property
    def text(self) -> str:
        """The message's text as a text-only chat template sees it (refusals included,
        images as placeholders)."""
        return parts_text(self.content)


@dataclass(frozen=True, slots=True)
class FunctionCall:
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: ItemStatus = "completed"
    namespace: str | None = None
    """The namespace tool the function belongs to (the model sees `flat_name`)."""
    custom: bool = False
    """A `custom` tool's call (`custom_tool_call`): `arguments` is its free-form input,
    which the model sees and writes as the one string argument `input`."""

    @property
    def flat_name(self) -> str:
        return flat_name(self.namespace, self.name)


def flat_name(namespace: str | None, name: str) -> str:
    """A namespaced function's name as the model sees it: `crm__lookup`.

    Chat templates know only flat function lists, so namespace tools are flattened
    under MCP-style names; calls are split back into `namespace` and `name`."""
    if not namespace:
        return name
    return f"{namespace}{name}" if namespace.endswith("__") else f"{namespace}__{name}"


def custom_input(arguments: str) -> str:
    """A `custom` tool's input from the arguments the model wrote for it: the string
    `input`, else a lone string value, else the arguments text as it stands."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(value, dict):
        if isinstance(value.get("input"), str):
            return str(value["input"])
        strings = [v for v in value.values() if isinstance(v, str)]
        if len(value) == 1 and len(strings) == 1:
            return strings[0]
    return value if isinstance(value, str) else arguments


@dataclass(frozen=True, slots=True)
class FunctionCallOutput:
    call_id: str
    output: str
    """The output as text (`parts_text` of `parts` when it was sent as parts)."""
    id: str | None = None
    parts: tuple[ContentPart, ...] | None = None
    """The output as sent when it was a list of parts (text and images)."""
    custom: bool = False
    """The output of a `custom` tool's call (`custom_tool_call_output`)."""


@dataclass(frozen=True, slots=True)
class Reasoning:
    text: str
    id: str | None = None
    status: ItemStatus = "completed"


@dataclass(frozen=True, slots=True)
class Compaction:
    """A compacted history: a summary standing in for earlier turns, and the turns kept.

    In JSON it is `{"type": "compaction", "encrypted_content": …}`, where the content is
    base64url JSON of `summary` and `preserved` (not encrypted: client input like any
    other)."""

    summary: str
    preserved: tuple[Item, ...] = ()
    id: str | None = None


Item: TypeAlias = Message | FunctionCall | FunctionCallOutput | Reasoning | Compaction


@dataclass(frozen=True, slots=True)
class ItemReference:
    """An input entry that names a stored item by id, resolved before the input is read."""

    id: str
    index: int
    """Its place in the request's input (errors name `input[index].id`)."""


SUMMARY_PREFIX = "Summary of the earlier conversation, which it replaces:\n\n"


def replay(items: Sequence[Item]) -> list[Item]:
    """The items as the model sees them: the last compaction stands in for every item
    before it except system and developer messages, as its summary (a user message)
    followed by the turns it preserved."""
    last = max((i for i, item in enumerate(items) if isinstance(item, Compaction)), default=-1)
    if last < 0:
        return list(items)
    compaction = items[last]
    assert isinstance(compaction, Compaction)
    kept = [
        item
        for item in items[:last]
        if isinstance(item, Message) and item.role in ("system", "developer")
    ]
    summary = Message("user", (InputText(SUMMARY_PREFIX + compaction.summary),))
    return [*kept, summary, *compaction.preserved, *items[last + 1 :]]


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    cache_write_tokens: int = 0
    """Prompt tokens read and kept by the prompt cache."""

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class ResponseError:
    code: str
    message: str


def _text_format_default() -> JsonValue:
    """A fresh `{"format": {"type": "text"}}` each time: echoes never share one dict."""
    return {"format": {"type": "text"}}


@dataclass(frozen=True, slots=True)
class RequestEcho:
    """The request fields a response object echoes back (OpenAI's defaults when unsent).

    Client-shaped values this server only echoes (tools, text, reasoning, metadata,
    tool_choice) are kept as the JSON the client sent. What steers the response's path
    (`store`, `background`) is the record's own, not part of the echo.
    """

    model: str
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_logprobs: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    metadata: dict[str, str] = field(default_factory=dict)
    previous_response_id: str | None = None
    tool_choice: JsonValue = "auto"
    tools: tuple[JsonValue, ...] = ()
    parallel_tool_calls: bool = True
    text: JsonValue = field(default_factory=_text_format_default)
    reasoning: JsonValue = None
    truncation: str = "disabled"
    user: str | None = None
    conversation_id: str | None = None
    max_tool_calls: int | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    include: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ResponseRecord:
    """A response object, in whatever state it is in."""

    id: str
    created_at: int
    status: ResponseStatus
    echo: RequestEcho
    output: tuple[Item, ...] = ()
    usage: Usage | None = None
    incomplete_reason: str | None = None
    error: ResponseError | None = None
    completed_at: int | None = None
    stop_sequence: str | None = None
    """The stop string (`stop`, `stop_sequences`) the reply ended at, if it did."""
    input_items: tuple[Item, ...] = ()
    tenant: str = ""
    """Who created it (the name of the API key it came with; "" with no keys): no other
    tenant can read, continue, cancel or delete it."""
    store: bool = True
    """Which table keeps it: the stored responses (retrieved, continued), or, false,
    none, except a background one's final object, kept ephemeral for a short TTL like its
    event log. The object shows it as `store`."""
    background: bool = False
    """Whether it runs as a job (queued, polled, cancelled, its events resumable) rather
    than within its request. The object shows it as `background`."""

    @property
    def output_text(self) -> str:
        return "".join(
            p.text
            for item in self.output
            if isinstance(item, Message)
            for p in item.content
            if isinstance(p, OutputText)
        )


def failed(
    record: ResponseRecord,
    error: ResponseError,
    *,
    usage: Usage | None,
    output: tuple[Item, ...] = (),
) -> ResponseRecord:
    """`record` ended `failed` with `error`: the one way every layer fails a response.

    Partial output is dropped unless the caller keeps some (`output`); `usage` is what
    the caller counts (what ran, the prompt alone, or nothing). The rest is kept."""
    return replace(record, status="failed", output=output, usage=usage, error=error)


def cancelled(
    record: ResponseRecord, *, usage: Usage, output: tuple[Item, ...] = ()
) -> ResponseRecord:
    """`record` ended `cancelled`, keeping `output` (what was generated before the
    cancel, as it stood) and counting `usage`. The rest is kept."""
    return replace(record, status="cancelled", output=output, usage=usage)


@dataclass(frozen=True, slots=True)
class Conversation:
    """A conversation transcript: the items of its turns, in order."""

    id: str
    created_at: int
    metadata: dict[str, str] = field(default_factory=dict)
    items: tuple[Item, ...] = ()
    response_ids: tuple[str, ...] = ()
    """The responses whose turns were appended (charged to the byte budget like the items)."""


def new_id(prefix: str) -> str:
    """An OpenAI-style id: `resp_…`, `msg_…`, `fc_…`, `call_…`."""
    return f"{prefix}_{secrets.token_hex(24)}"


def new_conversation_id() -> str:
    """A `conv_…` id whose last 8 hex digits check the rest, so the server can tell its
    own ids (whose absence means deleted or expired) from ids a client made up."""
    body = secrets.token_hex(20)
    return f"conv_{body}{_check(body)}"


def conversation_key(tenant: str, conversation_id: str) -> str:
    """Where a tenant's conversation is stored: under the tenant's name when the server
    has tenants, so each tenant's ids (free-form ones such as "default" too) are its own;
    the id itself with one tenant. Ids never hold a "/", so the key names one pair."""
    return f"{tenant}/{conversation_id}" if tenant else conversation_id


def conversation_shown_id(key: str) -> str:
    """The id a client uses for the conversation stored under `key`."""
    return key.rpartition("/")[2]


def is_minted_conversation_id(conversation_id: str) -> bool:
    """Whether the id (or the store key made of it) has the shape `new_conversation_id`
    gives (free-form ids never do, short of a one-in-four-billion accident)."""
    conversation_id = conversation_shown_id(conversation_id)
    rest = conversation_id.removeprefix("conv_")
    if len(conversation_id) != 53 or len(rest) != 48 or rest.strip("0123456789abcdef"):
        return False
    return _check(rest[:40]) == rest[40:]


def _check(body: str) -> str:
    return hashlib.blake2s(body.encode(), digest_size=4).hexdigest()
