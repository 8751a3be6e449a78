"""Chat Completions and legacy Completions bodies (`chat_schemas.py`) converted into the
`ResponseParams` preparation reads.

A chat request is a Responses request without storage: messages become conversation items
(assistant `tool_calls` function calls, `tool` messages their outputs), `response_format` the
Responses `text.format`. A completion is one raw prompt text.
"""

from __future__ import annotations

from pydantic import JsonValue

from mlxcel.errors import InvalidRequest, UnsupportedFeature
from mlxcel.http.chat_sampling import check_n, logit_bias, stops, wrapped_seed
from mlxcel.http.chat_schemas import (
    LOGPROBS,
    AssistantMessage,
    ChatCompletionBody,
    ChatTool,
    CompletionBody,
    ImagePart,
    JsonObjectFormat,
    JsonSchemaFormat,
    NamedToolChoice,
    SystemMessage,
    Text,
    TextFormat,
    TextPart,
    ToolMessage,
    UserMessage,
)
from mlxcel.http.files import ChatFilePart
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
