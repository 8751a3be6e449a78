"""Anthropic's Messages API at the edge: pydantic models of `POST /v1/messages` and
`/v1/messages/count_tokens` bodies.

Lenient where clients run ahead of any server: unknown fields are accepted and ignored
at every level (`citations`, `context_management`, `service_tier`, `container`, `mcp_servers` and whatever comes next), and a `thinking`
type this server has not heard of counts as thinking on. Strict where a bad value must
be a 400: the known fields' types and ranges, the roles, and the content block types
(a block this server cannot read is refused, not dropped). Their conversion into
`ResponseParams` is `http/messages_params.py`'s.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, JsonValue, Tag, model_validator

from mlxcel.http.item_schemas import _Model, check_parts

MAX_STOP_SEQUENCES = 64
"""Each stop sequence is looked for in every piece of the reply as it streams."""


class _Cacheable(_Model):
    """A part a client may mark for the prompt cache (`cache_control`): the marks change
    nothing here (every prompt is cached), but usage reports cache writes only when a
    request has one, as Anthropic does (`http/messages_objects.py`)."""

    cache_control: dict[str, JsonValue] | None = None


class TextBlock(_Cacheable):
    type: Literal["text"]
    text: str


class Base64Source(_Model):
    type: Literal["base64"]
    media_type: str
    data: str


class UrlSource(_Model):
    type: Literal["url"]
    url: str = Field(min_length=1)


class FileSource(_Model):
    type: Literal["file"]
    file_id: str = Field(min_length=1)


class PlainTextSource(_Model):
    type: Literal["text"]
    data: str
    media_type: str | None = None


ImageSource = Annotated[Base64Source | UrlSource | FileSource, Field(discriminator="type")]


class ImageBlock(_Cacheable):
    """An image, kept as sent (base64 as a data URL); a model without vision reads a
    placeholder, or the request is a 400 under `--images reject`."""

    type: Literal["image"]
    source: ImageSource


class DocumentBlock(_Cacheable):
    """A document; only plain text ones are read (as text)."""

    type: Literal["document"]
    source: Annotated[
        PlainTextSource | Base64Source | UrlSource | FileSource, Field(discriminator="type")
    ]
    title: str | None = None


class ThinkingBlock(_Cacheable):
    """A reasoning trace sent back; its `signature` finds the trace as it was generated."""

    type: Literal["thinking"]
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(_Model):
    type: Literal["redacted_thinking"]
    data: str = ""


class ToolUseBlock(_Cacheable):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, JsonValue]


ResultPart = Annotated[TextBlock | ImageBlock | DocumentBlock, Field(discriminator="type")]


class ToolResultBlock(_Cacheable):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[ResultPart] | None = None
    is_error: bool | None = None


UserBlock = Annotated[
    TextBlock | ImageBlock | DocumentBlock | ToolResultBlock, Field(discriminator="type")
]
AssistantBlock = Annotated[
    TextBlock | ThinkingBlock | RedactedThinkingBlock | ToolUseBlock, Field(discriminator="type")
]


class UserMessage(_Model):
    role: Literal["user"]
    content: str | list[UserBlock]


class AssistantMessage(_Model):
    role: Literal["assistant"]
    content: str | list[AssistantBlock]


class SystemMessage(_Model):
    """A system message in the conversation (Claude Code sends them mid-conversation)."""

    role: Literal["system"]
    content: str | list[TextBlock]


MessageIn = Annotated[UserMessage | AssistantMessage | SystemMessage, Field(discriminator="role")]


class CustomTool(_Cacheable):
    """A client tool: the model sees it as a function whose parameters are `input_schema`."""

    type: Literal["custom"] | None = None
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, JsonValue]


class TypedTool(_Cacheable):
    """A tool Anthropic defines by its type (`web_search_…`, `bash_…`, `text_editor_…`):
    this server runs none, so it follows `--hosted-tools` (a 400, or left out)."""

    type: str
    name: str | None = None


def _tool_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "custom" if kind in (None, "custom") else "typed"


Tool = Annotated[
    Annotated[CustomTool, Tag("custom")] | Annotated[TypedTool, Tag("typed")],
    Discriminator(_tool_kind),
]


class ToolChoiceAuto(_Model):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(_Model):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(_Model):
    type: Literal["tool"]
    name: str = Field(min_length=1)
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(_Model):
    type: Literal["none"]


ToolChoice = Annotated[
    ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone,
    Field(discriminator="type"),
]


class Thinking(_Model):
    """`enabled`, `adaptive` (or any newer kind) turn the template's thinking switch on,
    `disabled` off; `display: "omitted"` sends each trace empty, with its signature."""

    type: str
    budget_tokens: int | None = None
    display: str | None = None

    @property
    def on(self) -> bool:
        return self.type != "disabled"


class Metadata(_Model):
    user_id: str | None = None


class CountTokensBody(_Model):
    """`POST /v1/messages/count_tokens`: a message request without its output settings."""

    model: str
    messages: Annotated[list[MessageIn], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None

    @model_validator(mode="before")
    @classmethod
    def _bounded(cls, data: Any) -> Any:
        if isinstance(data, dict):
            check_parts(data.get("messages"), "messages")
        return data


class JsonOutputFormat(_Model):
    """Structured output: the reply is JSON valid against `schema`."""

    type: Literal["json_schema"]
    schema_: dict[str, JsonValue] = Field(alias="schema")


class OutputConfig(_Model):
    """`output_config`: its `format` is enforced (the grammar chat's `response_format`
    uses); its other settings (`effort`, …) change nothing here."""

    format: JsonOutputFormat | None = None


class MessagesBody(CountTokensBody):
    """`POST /v1/messages`."""

    output_config: OutputConfig | None = None
    output_format: JsonOutputFormat | None = None
    """The structured-outputs beta's name of `output_config.format`."""

    cache_control: dict[str, JsonValue] | None = None
    """Anthropic's automatic caching: marks the request's last cacheable part."""

    max_tokens: int = Field(ge=1)
    stream: bool | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    stop_sequences: Annotated[list[str], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    metadata: Metadata | None = None

    def output_schema(self) -> tuple[str, dict[str, JsonValue]] | None:
        """The schema the reply must follow and the field that named it, if any."""
        if self.output_config is not None and self.output_config.format is not None:
            return "output_config.format", self.output_config.format.schema_
        if self.output_format is not None:
            return "output_format", self.output_format.schema_
        return None

    def marks_cache(self) -> bool:
        """Whether `cache_control` is set on the request or any of its parts."""
        parts: list[Any] = [self, *(self.tools or ())]
        if not isinstance(self.system, str | None):
            parts += self.system
        for message in self.messages:
            if isinstance(message.content, list):
                parts += message.content
                parts += [
                    inner
                    for block in message.content
                    if isinstance(block, ToolResultBlock) and isinstance(block.content, list)
                    for inner in block.content
                ]
        return any(getattr(part, "cache_control", None) is not None for part in parts)
