"""A Messages API body as the `ResponseParams` preparation reads: Anthropic's blocks as
conversation items, its tools and settings as the Responses API's.

`system` becomes the instructions, less a leading `x-anthropic-billing-header:` line
(Claude Code's, with a nonce that changes every request: left in, no prompt-cache entry
would ever match the next turn). A `system` message in the conversation becomes a
developer message; user text and images become input parts, `tool_result` blocks call
outputs; assistant text, `tool_use` and `thinking` blocks become a message, function
calls and reasoning (`redacted_thinking` is dropped: nothing here can read it). A
thinking block's signature travels with its item's place (`ResponseParams.signed`), so
preparation can put back the trace as it was generated.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence

from mlxcel.errors import UnsupportedFeature
from mlxcel.http.messages_schemas import (
    AssistantMessage,
    Base64Source,
    CountTokensBody,
    CustomTool,
    DocumentBlock,
    FileSource,
    ImageBlock,
    MessagesBody,
    PlainTextSource,
    RedactedThinkingBlock,
    SystemMessage,
    TextBlock,
    ThinkingBlock,
    Tool,
    ToolChoice,
    ToolChoiceAny,
    ToolChoiceNone,
    ToolChoiceTool,
    ToolResultBlock,
    ToolUseBlock,
    UrlSource,
    UserMessage,
)
from mlxcel.items import (
    ContentPart,
    FunctionCall,
    FunctionCallOutput,
    InputImage,
    InputText,
    Item,
    JsonValue,
    Message,
    OutputText,
    Reasoning,
    new_id,
    parts_text,
)
from mlxcel.prepare.params import ResponseParams

log = logging.getLogger(__name__)

BILLING_HEADER = "x-anthropic-billing-header:"
TOOL_ERROR = "Error: "
"""Leads the output of a `tool_result` marked `is_error`, so the model reads it as one."""
_billing_logged = False


def message_params(body: CountTokensBody) -> ResponseParams:
    """`body` as parameters (run it off the event loop: messages can be many). A count
    body has no output settings; a messages body has them all."""
    items, signed = _conversation(body.messages)
    choice, parallel = _tool_choice(body.tool_choice)
    params = ResponseParams(
        model=body.model,
        input=items,
        instructions=_instructions(body.system),
        store=False,
        tools=tuple(_tool(t) for t in body.tools) if body.tools is not None else None,
        tool_choice=choice,
        parallel_tool_calls=parallel,
        chat_template_kwargs={"enable_thinking": bool(body.thinking and body.thinking.on)},
        signed=signed,
    )
    if not isinstance(body, MessagesBody):
        return params
    return dataclasses.replace(
        params,
        max_output_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        user=body.metadata.user_id if body.metadata else None,
        stop=tuple(body.stop_sequences or ()),
        text=_text(body),
    )


def _text(body: MessagesBody) -> dict[str, JsonValue] | None:
    """A structured output's schema as the Responses API's `text.format`."""
    found = body.output_schema()
    if found is None:
        return None
    return {"format": {"type": "json_schema", "name": "output", "schema": found[1]}}


def _instructions(system: str | list[TextBlock] | None) -> str | None:
    """The system text, less Claude Code's leading billing line (logged once)."""
    if system is None:
        return None
    texts = [system] if isinstance(system, str) else [block.text for block in system]
    if texts and texts[0].lstrip().startswith(BILLING_HEADER):
        texts[0] = texts[0].lstrip().partition("\n")[2]
        _log_billing()
    return "\n\n".join(text for text in texts if text) or None


def _log_billing() -> None:
    global _billing_logged
    if not _billing_logged:
        _billing_logged = True
        log.info(
            "removing the %r line from 'system' (its nonce changes every request and would "
            "defeat the prompt cache); CLAUDE_CODE_ATTRIBUTION_HEADER=0 stops Claude Code "
            "sending it",
            BILLING_HEADER.rstrip(":"),
        )


def _conversation(
    messages: Sequence[UserMessage | AssistantMessage | SystemMessage],
) -> tuple[tuple[Item, ...], tuple[tuple[int, str], ...]]:
    """The items of `messages`, and each signed trace's place among them."""
    items: list[Item] = []
    signed: list[tuple[int, str]] = []
    for message in messages:
        match message:
            case SystemMessage(content=content):
                text = content if isinstance(content, str) else "".join(b.text for b in content)
                items.append(Message("developer", (InputText(text),), id=new_id("msg")))
            case UserMessage(content=str(text)):
                items.append(Message("user", (InputText(text),), id=new_id("msg")))
            case UserMessage(content=list(blocks)):
                items += _user(blocks)
            case AssistantMessage(content=str(text)):
                items.append(Message("assistant", (OutputText(text),), id=new_id("msg")))
            case AssistantMessage(content=list(blocks)):
                _assistant(blocks, items, signed)
    return tuple(items), tuple(signed)


def _user(
    blocks: Sequence[TextBlock | ImageBlock | DocumentBlock | ToolResultBlock],
) -> list[Item]:
    """Text, images and documents as one user message each run; each tool result as a
    call output, in the order sent."""
    items: list[Item] = []
    parts: list[ContentPart] = []
    for block in blocks:
        if isinstance(block, ToolResultBlock):
            if parts:
                items.append(Message("user", tuple(parts), id=new_id("msg")))
                parts = []
            items.append(_tool_result(block))
        else:
            parts.append(_part(block))
    if parts:
        items.append(Message("user", tuple(parts), id=new_id("msg")))
    return items


def _assistant(
    blocks: Sequence[TextBlock | ThinkingBlock | RedactedThinkingBlock | ToolUseBlock],
    items: list[Item],
    signed: list[tuple[int, str]],
) -> None:
    """Reasoning, a message of each run of text, and calls, in the order sent."""
    text: list[ContentPart] = []
    for block in blocks:
        if isinstance(block, TextBlock):
            text.append(OutputText(block.text))
            continue
        if text:
            items.append(Message("assistant", tuple(text), id=new_id("msg")))
            text = []
        match block:
            case ThinkingBlock(thinking=thinking, signature=signature):
                if signature:
                    signed.append((len(items), signature))
                items.append(Reasoning(thinking, id=new_id("rs")))
            case ToolUseBlock(id=call_id, name=name, input=arguments):
                items.append(FunctionCall(call_id, name, json.dumps(arguments), new_id("fc")))
            case RedactedThinkingBlock():
                pass  # encrypted by another server: nothing here can read it
    if text:
        items.append(Message("assistant", tuple(text), id=new_id("msg")))


def _part(block: TextBlock | ImageBlock | DocumentBlock) -> ContentPart:
    match block:
        case TextBlock(text=text):
            return InputText(text)
        case ImageBlock(source=Base64Source(media_type=media_type, data=data)):
            return InputImage(f"data:{media_type};base64,{data}")
        case ImageBlock(source=FileSource(file_id=file_id)):
            return InputImage(file_id=file_id)
        case ImageBlock(source=UrlSource(url=url)):
            return InputImage(url)
        case DocumentBlock(source=PlainTextSource(data=data), title=title):
            return InputText(f"{title}\n\n{data}" if title else data)
    raise UnsupportedFeature(
        'Only plain-text documents (`source.type: "text"`) are supported.',
        param="messages",
        code="unsupported_value",
    )


def _tool_result(block: ToolResultBlock) -> FunctionCallOutput:
    content = block.content
    lead: list[ContentPart] = [InputText(TOOL_ERROR)] if block.is_error else []
    if content is None or isinstance(content, str):
        parts = (*lead, InputText(content or ""))
        return FunctionCallOutput(block.tool_use_id, parts_text(parts), id=new_id("fco"))
    parts = (*lead, *(_part(part) for part in content))
    return FunctionCallOutput(
        block.tool_use_id, parts_text(parts), id=new_id("fco"), parts=tuple(parts)
    )


def _tool(tool: Tool) -> dict[str, JsonValue]:
    if isinstance(tool, CustomTool):
        out: dict[str, JsonValue] = {"type": "function", "name": tool.name}
        if tool.description is not None:
            out["description"] = tool.description
        out["parameters"] = tool.input_schema
        return out
    return {"type": tool.type, "name": tool.name}


def _tool_choice(
    choice: ToolChoice | None,
) -> tuple[str | dict[str, JsonValue] | None, bool | None]:
    """`tool_choice` as the Responses API's, and `parallel_tool_calls`."""
    if choice is None:
        return None, None
    disabled = not isinstance(choice, ToolChoiceNone) and choice.disable_parallel_tool_use
    parallel = False if disabled else None
    match choice:
        case ToolChoiceNone():
            return "none", parallel
        case ToolChoiceAny():
            return "required", parallel
        case ToolChoiceTool(name=name):
            return {"type": "function", "name": name}, parallel
    return "auto", parallel
