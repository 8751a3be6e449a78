"""Chat Completions and legacy Completions at the edge: pydantic models of their request
bodies (their conversion into the `ResponseParams` preparation reads is `chat_params.py`).

A chat request is a Responses request without storage: messages become conversation items
(assistant `tool_calls` function calls, `tool` messages their outputs), `response_format` the
Responses `text.format`. A completion is one raw prompt text.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, JsonValue, model_validator

from mlxcel.http.chat_sampling import (
    SEED_RANGE,
    Penalty,
    check_logit_bias_size,
)
from mlxcel.http.files import ChatFilePart
from mlxcel.http.item_schemas import _Model, check_parts

LOGPROBS = "message.output_text.logprobs"


class TextPart(_Model):
    type: Literal["text"]
    text: str


class RefusalPart(_Model):
    type: Literal["refusal"]
    refusal: str


Text = str | list[TextPart]


class ImageUrl(_Model):
    url: str = Field(min_length=1)
    detail: Literal["low", "high", "auto"] | None = None


class ImagePart(_Model):
    """An image in a user message (a URL or data URL), read as an `input_image` part."""

    type: Literal["image_url"]
    image_url: ImageUrl


UserContent = (
    str | list[Annotated[TextPart | ImagePart | ChatFilePart, Field(discriminator="type")]]
)


class SystemMessage(_Model):
    role: Literal["system", "developer"]
    content: Text
    name: str | None = None


class UserMessage(_Model):
    role: Literal["user"]
    content: UserContent
    name: str | None = None


class CalledFunction(_Model):
    name: str
    arguments: str


class ToolCallIn(_Model):
    id: str
    type: Literal["function"]
    function: CalledFunction


class AssistantMessage(_Model):
    role: Literal["assistant"]
    content: str | list[Annotated[TextPart | RefusalPart, Field(discriminator="type")]] | None = (
        None
    )
    refusal: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    reasoning_content: str | None = None
    """The reasoning trace of an earlier reply (as this server sends it), replayed."""
    name: str | None = None


class ToolMessage(_Model):
    role: Literal["tool"]
    content: Text
    tool_call_id: str


ChatMessageIn = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]


class FunctionDefinition(_Model):
    name: str
    description: str | None = None
    parameters: dict[str, JsonValue] | None = None
    strict: bool | None = None


class ChatTool(_Model):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Model):
    name: str


class NamedToolChoice(_Model):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaSpec(_Model):
    name: str
    description: str | None = None
    schema_: dict[str, JsonValue] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextFormat(_Model):
    type: Literal["text"]


class JsonObjectFormat(_Model):
    type: Literal["json_object"]


class JsonSchemaFormat(_Model):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")
]


class StreamOptions(_Model):
    include_usage: bool | None = None


Stop = str | Annotated[list[str], Field(max_length=4)]
Seed = Annotated[int, Field(ge=-SEED_RANGE, lt=SEED_RANGE)]


class ChatCompletionBody(_Model):
    """`POST /v1/chat/completions`. Fields this server does not use (`metadata`, `store`,
    `reasoning_effort`) are accepted and ignored."""

    model: str
    messages: Annotated[list[ChatMessageIn], Field(min_length=1)]
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stop: Stop | None = None
    seed: Seed | None = None
    n: int | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    logit_bias: dict[str, float] | None = None
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    user: str | None = None
    prompt_cache_key: str | None = None
    chat_template_kwargs: dict[str, JsonValue] | None = None
    """Passed straight to the chat template (e.g. `enable_thinking`)."""

    @model_validator(mode="before")
    @classmethod
    def _bounded(cls, data: Any) -> Any:
        if isinstance(data, dict):
            check_parts(data.get("messages"), "messages")
        check_logit_bias_size(data)
        return data

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionBody(_Model):
    """`POST /v1/completions`: one raw prompt, no chat template."""

    @model_validator(mode="before")
    @classmethod
    def _bounded(cls, data: Any) -> Any:
        check_logit_bias_size(data)
        return data

    model: str
    prompt: str | Annotated[list[str], Field(min_length=1)]
    max_tokens: int | None = Field(default=16, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stop: Stop | None = None
    seed: Seed | None = None
    n: int | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    logit_bias: dict[str, float] | None = None
    best_of: int | None = None
    echo: bool | None = None
    suffix: str | None = None
    logprobs: int | None = Field(default=None, ge=0, le=5)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]
