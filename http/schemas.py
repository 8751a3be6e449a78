"""The API's shapes at the edge: pydantic models of request bodies, and the cursor page
(`list_page`) the list endpoints read from their query arguments.

Requests are validated here and turned into plain `mlxcel.items` data; everything past
this module is free of pydantic. The input items the bodies carry are
`http/item_schemas.py`'s; the JSON of responses, items and conversations is
`http/objects.py`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import Field, JsonValue, model_validator

from mlxcel.errors import InvalidRequest
from mlxcel.http.chat_sampling import Penalty
from mlxcel.http.item_schemas import ResponseInputItemIn, _Model, check_parts
from mlxcel.items import Item

MAX_COMPACT_THRESHOLD = 100_000_000

Includable = Literal[
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
]
"""The `include` values the `openai` SDK knows (`ResponseIncludable`); others are a 400,
as on the hosted API. Only the last two change a response here: the hosted tools the
rest name never run on this server."""
ServiceTier = Literal["auto", "default", "flex", "scale", "priority", "fast", "ultrafast"]
VERBOSITY = ("low", "medium", "high")


class CompactionSetting(_Model):
    """`context_management: [{"type": "compaction", "compact_threshold": N}]`."""

    type: Literal["compaction"]
    compact_threshold: int | None = Field(default=None, ge=1, le=MAX_COMPACT_THRESHOLD)


class _BoundedInput(_Model):
    @model_validator(mode="before")
    @classmethod
    def _bounded(cls, data: Any) -> Any:
        if isinstance(data, dict):
            check_parts(data.get("input"))
        return data


class CreateResponseBody(_BoundedInput):
    model: str
    input: str | list[ResponseInputItemIn]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    store: bool | None = None
    stream: bool | None = None
    background: bool | None = None
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(
        default=None, max_length=16
    )
    truncation: Literal["disabled", "auto"] | None = None
    tools: list[dict[str, JsonValue]] | None = None
    tool_choice: str | dict[str, JsonValue] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, JsonValue] | None = None
    reasoning: dict[str, JsonValue] | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, JsonValue] | None = None
    user: str | None = None
    prompt_cache_key: str | None = Field(default=None, max_length=1024)
    include: list[Includable] | None = None
    max_tool_calls: int | None = Field(default=None, ge=1)
    service_tier: ServiceTier | None = None
    safety_identifier: str | None = Field(default=None, max_length=128)
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prompt: JsonValue = None
    """A stored prompt template: there are none here, so a 400 rather than a reply
    written without it."""
    chat_template_kwargs: dict[str, JsonValue] | None = None
    """Passed straight to the chat template (e.g. `enable_thinking`); `reasoning.effort`
    is deliberately not mapped to it."""
    context_management: list[CompactionSetting] | None = Field(default=None, max_length=1)

    @model_validator(mode="after")
    def _checked(self) -> CreateResponseBody:
        if self.prompt is not None:
            raise InvalidRequest(
                "Prompt templates ('prompt') are not stored on this server; send the "
                "prompt as 'instructions' and 'input'.",
                param="prompt",
                code="unsupported_parameter",
            )
        verbosity = (self.text or {}).get("verbosity")
        if verbosity is not None and verbosity not in VERBOSITY:
            raise InvalidRequest(
                f"Invalid 'text.verbosity': expected one of {', '.join(VERBOSITY)}.",
                param="text.verbosity",
                code="invalid_value",
            )
        return self

    @property
    def compact_threshold(self) -> int | None:
        """Compact first at this many rendered input tokens (None: no compaction)."""
        for setting in self.context_management or ():
            return setting.compact_threshold or MAX_COMPACT_THRESHOLD
        return None


class CompactBody(_BoundedInput):
    """`POST /v1/responses/compact`."""

    model: str
    input: str | list[ResponseInputItemIn] = Field(default_factory=list)
    instructions: str | None = None
    """What the summary must keep, besides the default goals, decisions and next steps."""
    previous_response_id: str | None = None
    conversation: str | dict[str, JsonValue] | None = None
    """Rejected: compaction takes its history from `input` or a response chain."""
    stream: bool | None = None
    keep_tokens: int | None = Field(default=None, gt=0)
    max_output_tokens: int | None = Field(default=None, ge=1, le=16384)
    tools: list[dict[str, JsonValue]] | None = None
    chat_template_kwargs: dict[str, JsonValue] | None = None
    prompt_cache_key: str | None = None
    user: str | None = None


Metadata = dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]]


class ConversationCreateBody(_Model):
    items: list[ResponseInputItemIn] | None = Field(default=None, max_length=20)
    metadata: Metadata | None = Field(default=None, max_length=16)


class ConversationUpdateBody(_Model):
    metadata: Metadata = Field(max_length=16)


class ConversationItemsBody(_Model):
    items: list[ResponseInputItemIn] = Field(min_length=1, max_length=20)
    """Items, or references to the tenant's stored response items (`item_reference`)."""


class InputTokensBody(CreateResponseBody):
    """`/v1/responses/input_tokens` takes a create body whose `model` may be left out."""

    model: str | None = None  # type: ignore[assignment]


def list_page(
    items: Sequence[Item], args: Mapping[str, str], render: Callable[[Item], dict[str, Any]]
) -> dict[str, Any]:
    """A cursor page (`after`, `limit` 1..100 default 20, `order` asc|desc default desc) of
    `items`, each of the page `render`ed: the page is cut first, so a long list costs one
    pass over its ids, not the JSON of every item."""
    order = args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest(
            "Invalid 'order': expected 'asc' or 'desc'.", param="order", code="invalid_value"
        )
    try:
        limit = int(args.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise InvalidRequest(
            "Invalid 'limit': expected an integer from 1 to 100.",
            param="limit",
            code="invalid_value",
        )
    ordered = items if order == "asc" else items[::-1]
    start = 0
    after = args.get("after")
    if after is not None:
        start = next((n + 1 for n, item in enumerate(ordered) if item.id == after), -1)
        if start < 0:
            raise InvalidRequest(
                f"Invalid 'after': no item with id {after[:64]!r}.",
                param="after",
                code="invalid_value",
            )
    data = [render(item) for item in ordered[start : start + limit]]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(ordered) - start > limit,
    }


class ModelAction(_Model):
    """llama.cpp's `POST /models/load` and `/models/unload` body."""

    model: str
