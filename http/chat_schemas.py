"""Chat Completions and legacy Completions at the edge: pydantic models of their request
bodies, and their conversion into the `ResponseParams` preparation reads.

A chat request is a Responses request without storage: messages become conversation items
(assistant `tool_calls` function calls, `tool` messages their outputs), `response_format` the
Responses `text.format`. A completion is one raw prompt text.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, JsonValue, model_validator

from mlxcel.errors import InvalidRequest, UnsupportedFeature
from mlxcel.http.chat_sampling import (
    SEED_RANGE,
    Penalty,
    check_logit_bias_size,
    check_n,
    logit_bias,
    stops,
    wrapped_seed,
)
from mlxcel.http.files import ChatFilePart
from mlxcel.http.item_schemas import _Model, check_parts
from mlxcel.items import (
    ContentPart,
    FunctionCall,
    FunctionCallOutput,
    InputImage,
    InputText,
    Item,
    Message,
    OutputText,
    Reasoning,
    Refusal,
    new_id,
)
from mlxcel.prepare.params import ResponseParams

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


def chat_params(body: ChatCompletionBody) -> ResponseParams:
    """`body` as parameters (run it off the event loop: messages can be many)."""
    check_n(body.n)
    if body.top_logprobs and not body.logprobs:
        raise InvalidRequest(
            "'top_logprobs' needs 'logprobs' set to true.",
            param="top_logprobs",
            code="invalid_value",
        )
    return ResponseParams(
        model=body.model,
        input=tuple(item for i, m in enumerate(body.messages) for item in _items(m, i)),
        max_output_tokens=body.max_completion_tokens or body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_logprobs=body.top_logprobs,
        store=False,
        tools=tuple(_tool(t) for t in body.tools) if body.tools is not None else None,
        tool_choice=_tool_choice(body.tool_choice),
        parallel_tool_calls=body.parallel_tool_calls,
        text=_text(body.response_format),
        user=body.user,
        prompt_cache_key=body.prompt_cache_key,
        include=(LOGPROBS,) if body.logprobs else (),
        chat_template_kwargs=body.chat_template_kwargs,
        stop=stops(body.stop),
        seed=wrapped_seed(body.seed),
        frequency_penalty=body.frequency_penalty,
        presence_penalty=body.presence_penalty,
        logit_bias=logit_bias(body.logit_bias),
    )


def completion_params(body: CompletionBody) -> ResponseParams:
    check_n(body.n)
    if isinstance(body.prompt, list) and len(body.prompt) != 1:
        raise UnsupportedFeature(
            "Only one prompt per request is supported.", param="prompt", code="unsupported_value"
        )
    if body.best_of not in (None, 1):
        raise UnsupportedFeature(
            "Only 'best_of' 1 is supported.", param="best_of", code="unsupported_value"
        )
    if body.suffix:
        raise UnsupportedFeature(
            "'suffix' (insertion) is not supported.", param="suffix", code="unsupported_value"
        )
    return ResponseParams(
        model=body.model,
        input=(Message("user", (InputText(body.text),), id=new_id("msg")),),
        max_output_tokens=body.max_tokens or 16,
        temperature=body.temperature,
        top_p=body.top_p,
        top_logprobs=body.logprobs,
        store=False,
        user=body.user,
        include=(LOGPROBS,) if body.logprobs is not None else (),
        stop=stops(body.stop),
        seed=wrapped_seed(body.seed),
        frequency_penalty=body.frequency_penalty,
        presence_penalty=body.presence_penalty,
        logit_bias=logit_bias(body.logit_bias),
        raw=True,
    )


def _items(
    message: SystemMessage | UserMessage | AssistantMessage | ToolMessage, index: int
) -> list[Item]:
    match message:
        case SystemMessage(role=role, content=content):
            return [Message(role, (InputText(_joined(content)),), id=new_id("msg"))]
        case UserMessage(content=str(text)):
            return [Message("user", (InputText(text),), id=new_id("msg"))]
        case UserMessage(content=list(parts)):
            return [Message("user", tuple(_user_part(p) for p in parts), id=new_id("msg"))]
        case ToolMessage(tool_call_id=call_id, content=content):
            return [FunctionCallOutput(call_id, _joined(content), id=new_id("fco"))]
        case AssistantMessage():
            return _assistant(message, index)
    raise AssertionError(message)


def _assistant(message: AssistantMessage, index: int) -> list[Item]:
    items: list[Item] = []
    if message.reasoning_content:
        items.append(Reasoning(message.reasoning_content, id=new_id("rs")))
    parts: list[ContentPart] = []
    if isinstance(message.content, str):
        parts.append(OutputText(message.content))
    for part in message.content if isinstance(message.content, list) else ():
        parts.append(OutputText(part.text) if isinstance(part, TextPart) else Refusal(part.refusal))
    if message.refusal:
        parts.append(Refusal(message.refusal))
    if parts:
        items.append(Message("assistant", tuple(parts), id=new_id("msg")))
    for call in message.tool_calls or ():
        function = call.function
        items.append(FunctionCall(call.id, function.name, function.arguments, new_id("fc")))
    if not parts and not message.tool_calls:
        raise InvalidRequest(
            "An assistant message needs 'content' or 'tool_calls'.",
            param=f"messages[{index}].content",
            code="missing_required_parameter",
        )
    return items


def _user_part(part: TextPart | ImagePart | ChatFilePart) -> ContentPart:
    if isinstance(part, ImagePart):
        return InputImage(part.image_url.url, detail=part.image_url.detail or "auto")
    return InputText(part.text)


def _joined(content: Text) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content)


def _tool(tool: ChatTool) -> dict[str, JsonValue]:
    function = tool.function
    out: dict[str, JsonValue] = {"type": "function", "name": function.name}
    if function.description is not None:
        out["description"] = function.description
    if function.parameters is not None:
        out["parameters"] = function.parameters
    if function.strict is not None:
        out["strict"] = function.strict
    return out


def _tool_choice(choice: str | NamedToolChoice | None) -> str | dict[str, JsonValue] | None:
    if isinstance(choice, NamedToolChoice):
        return {"type": "function", "name": choice.function.name}
    return choice


def _text(
    fmt: TextFormat | JsonObjectFormat | JsonSchemaFormat | None,
) -> dict[str, JsonValue] | None:
    """`response_format` as the Responses API's `text.format`."""
    if fmt is None or isinstance(fmt, TextFormat):
        return None
    if isinstance(fmt, JsonObjectFormat):
        return {"format": {"type": "json_object"}}
    spec = fmt.json_schema
    schema: dict[str, JsonValue] = spec.schema_ if spec.schema_ is not None else {"type": "object"}
    return {"format": {"type": "json_schema", "name": spec.name, "schema": schema}}
