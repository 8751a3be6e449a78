"""From a request's parameters and its history to a `GenerationRequest`: checks, echo,
rendering.

Everything that can reject a request before generation happens in preparation, so a bad
request is a 400 before any slot is taken.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

from mlxcel.errors import ContextLengthExceeded, InvalidRequest
from mlxcel.generation import (
    GenerationRequest,
    PromptCodec,
    Sampling,
    ServedModel,
    ToolUse,
)
from mlxcel.items import (
    Compaction,
    Item,
    JsonValue,
    Message,
    RequestEcho,
    ResponseRecord,
    new_id,
)
from mlxcel.prepare.chat_messages import to_chat
from mlxcel.prepare.echoing import echo_prefix, restore_reasoning, restore_signed
from mlxcel.prepare.history import conversation_id
from mlxcel.prepare.limits import check_input_size
from mlxcel.prepare.offload import off_loop
from mlxcel.prepare.params import ResponseParams
from mlxcel.prepare.tools import tool_use
from mlxcel.prepare.truncation import fit, note_dropped, output_reserve, turn_measure
from mlxcel.store import EchoHandle

# The server sets these itself when it renders a prompt.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "tokenize",
        "add_generation_prompt",
        "tools",
        "conversation",
        "messages",
        "chat_template",
        "continue_final_message",
        "return_dict",
        "documents",
    }
)


def input_items(
    items: tuple[Item, ...],
    instructions: str | None,
    tools: Sequence[dict[str, JsonValue]] | None,
    history: tuple[Item, ...],
    context_length: int,
) -> tuple[Item, ...]:
    """`items`, once it is known that with `history` they could fit the window (in a
    worker thread: a long input takes a while to measure)."""
    check_input_size(instructions, history + items, tools, context_length)
    return items


async def intake_items(
    params: ResponseParams, model: ServedModel, history: tuple[Item, ...], echo: EchoHandle
) -> tuple[Item, ...]:
    """The request's input items, checked against the window, with remembered
    reasoning restored; the heavy parts run off the event loop."""
    context_length = model.info.context_length
    if params.truncation != "auto":  # else the oldest turns are dropped to fit
        items = await off_loop(
            input_items, params.input, params.instructions, params.tools, history, context_length
        )
    else:
        items = params.input
    items = await restore_signed(params, items, echo)
    return await restore_reasoning(params, model.names.alias, items, echo)


def output_grammar(text: dict[str, JsonValue] | None, codec: PromptCodec) -> str | None:
    """The grammar `text.format` asks for: None for plain text, else a JSON grammar."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise InvalidRequest(
            "Invalid 'text.format': expected an object with a 'type'.",
            param="text.format",
            code="invalid_value",
        )
    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return codec.compile_schema({"type": "object"})
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise InvalidRequest(
                "Missing required parameter: 'text.format.schema'.",
                param="text.format.schema",
                code="missing_required_parameter",
            )
        if not isinstance(fmt.get("name"), str):
            raise InvalidRequest(
                "Missing required parameter: 'text.format.name'.",
                param="text.format.name",
                code="missing_required_parameter",
            )
        return codec.compile_schema(schema)
    raise InvalidRequest(
        f"Unsupported 'text.format.type': {str(kind)[:64]!r}.",
        param="text.format.type",
        code="invalid_value",
    )


def render(
    params: ResponseParams,
    history: tuple[Item, ...],
    codec: PromptCodec,
    items: tuple[Item, ...] | None = None,
    definitions: list[dict[str, Any]] | None = None,
    tail: tuple[Item, ...] = (),
    context_length: int = 0,
) -> tuple[tuple[Item, ...], list[int], int]:
    """The request's own input items, the prompt tokens of history + input (+ `tail`,
    such as the compaction that stands in for them), and how many of the rendered items
    `truncation: "auto"` dropped to fit `context_length` (0: no truncation).

    `definitions` are the chat-template tools when the caller already worked them out."""
    reserved = RESERVED_TEMPLATE_KWARGS & set(params.chat_template_kwargs or {})
    if reserved:
        raise InvalidRequest(
            f"'chat_template_kwargs' may not set {', '.join(sorted(reserved))}.",
            param="chat_template_kwargs",
            code="invalid_value",
        )
    if definitions is None:
        definitions, _, _ = tool_use(
            params.tools, params.tool_choice, codec, skip=params.ignored_tools, grammar=False
        )
    items = params.input if items is None else items
    if params.raw:
        text = "".join(item.text for item in items if isinstance(item, Message))
        return items, codec.encode(text), 0

    def rendered(kept: Sequence[Item]) -> list[int]:
        chat = to_chat(params.instructions, kept)
        return codec.render(chat, definitions or None, params.chat_template_kwargs)

    if params.truncation != "auto" or not context_length:
        return items, rendered(history + items + tail), 0
    budget = context_length - output_reserve(params.max_output_tokens, context_length)
    fixed = len(params.instructions or "") + len(json.dumps(definitions or []))
    measure = turn_measure(codec, params.chat_template_kwargs)
    fitted = fit(history + items + tail, rendered, budget, fixed, measure)
    return items, fitted.prompt, fitted.dropped


def build_request(
    params: ResponseParams,
    model: ServedModel,
    history: tuple[Item, ...],
    items: tuple[Item, ...] | None = None,
    compaction: Compaction | None = None,
    *,
    fits: bool = True,
    identity: tuple[str, int] | None = None,
) -> GenerationRequest:
    """The request to generate. With `compaction`, the prompt is rendered from it (it
    stands in for history and input). `fits=False` lets a prompt that leaves no room for
    output through, for a request that compacts it first. `identity` is the id and
    creation time of the response this request continues (after its compaction)."""
    info, codec = model.info, model.codec
    # Tools once per request: a forced call's grammar is compiled here, not twice.
    definitions, tools, call_grammar = tool_use(
        params.tools,
        params.tool_choice,
        codec,
        parser=info.tool_parser,
        parallel=params.parallel_tool_calls,
        skip=params.ignored_tools,
    )
    if tools is not None and params.max_tool_calls is not None:
        tools = dataclasses.replace(tools, max_calls=params.max_tool_calls)
    tail = (compaction,) if compaction is not None else ()
    items, prompt, dropped = render(
        params, history, codec, items, definitions, tail, info.context_length
    )
    _check_not_empty(params, prompt)
    max_tokens = _output_room(params, len(prompt), info.context_length, fits=fits)
    echo = _request_echo(params)
    response_id, created_at = identity or (new_id("resp"), int(time.time()))
    note_dropped(response_id, dropped, len(prompt))
    record = ResponseRecord(
        id=response_id,
        created_at=created_at,
        status="in_progress",
        echo=echo,
        input_items=items,
        tenant=params.tenant,
        store=True if params.store is None else params.store,
        background=bool(params.background),
    )
    sampling = Sampling(
        temperature=echo.temperature,
        top_p=echo.top_p,
        top_k=params.top_k or 0,
        max_tokens=max_tokens,
        grammar=_grammar(tools, call_grammar, params.text, codec),
        logprobs="message.output_text.logprobs" in (params.include or [])
        or bool(params.top_logprobs),
        top_logprobs=params.top_logprobs or 0,
        seed=params.seed,
        stop=params.stop,
        frequency_penalty=params.frequency_penalty or 0.0,
        presence_penalty=params.presence_penalty or 0.0,
        logit_bias=_known_tokens(params.logit_bias, info.vocab_size),
    )
    return GenerationRequest(
        record=record,
        prompt=tuple(prompt),
        sampling=sampling,
        tools=tools,
        reasoning_opened=not params.raw and codec.opens_reasoning(params.chat_template_kwargs),
        echo_prefix=echo_prefix(params, model.names.alias, items),
        truncated_items=dropped,
    )


def _check_not_empty(params: ResponseParams, prompt: Sequence[int]) -> None:
    """400 for a prompt of no tokens (a raw prompt of no text): the model has nothing to
    read and would fail on its thread, after the request took a slot."""
    if not prompt:
        raise InvalidRequest(
            "The prompt is empty: give at least one token of text.",
            param="prompt" if params.raw else "input",
            code="invalid_value",
        )


def _grammar(
    tools: ToolUse | None,
    call_grammar: str | None,
    text: dict[str, JsonValue] | None,
    codec: PromptCodec,
) -> str | None:
    """A forced call's grammar; else the one `text.format` asks for; else the one that
    enforces custom tools' grammars on their calls (the reply is free text otherwise)."""
    if tools is not None and tools.required:
        return call_grammar
    return output_grammar(text, codec) or call_grammar


def _known_tokens(
    bias: tuple[tuple[int, float], ...], vocab_size: int
) -> tuple[tuple[int, float], ...]:
    """`logit_bias`, once every id in it is a token of the model's (400 otherwise)."""
    outside = [token for token, _ in bias if vocab_size and token >= vocab_size]
    if outside:
        raise InvalidRequest(
            f"Invalid 'logit_bias': token id {outside[0]} is outside the model's "
            f"vocabulary (ids 0 to {vocab_size - 1}).",
            param="logit_bias",
            code="invalid_value",
        )
    return bias


def _output_room(
    params: ResponseParams, prompt_tokens: int, context_length: int, *, fits: bool = True
) -> int:
    """The tokens the reply may take: `max_output_tokens` within the room the prompt
    leaves, and at least one. A prompt that leaves no room is a 400 unless `fits` is off."""
    room = context_length - prompt_tokens
    if room < 1 and fits:
        raise ContextLengthExceeded(
            f"The input is {prompt_tokens} tokens; the context window is "
            f"{context_length} tokens and leaves no room for output.",
            tokens=prompt_tokens,
            maximum=context_length,
        )
    return max(1, min(params.max_output_tokens or room, room))


def _request_echo(params: ResponseParams) -> RequestEcho:
    """What the response object echoes of its request, with the API's defaults filled in."""
    return RequestEcho(
        model=params.model,
        instructions=params.instructions,
        max_output_tokens=params.max_output_tokens,
        temperature=1.0 if params.temperature is None else params.temperature,
        top_p=1.0 if params.top_p is None else params.top_p,
        top_logprobs=params.top_logprobs or 0,
        presence_penalty=params.presence_penalty or 0.0,
        frequency_penalty=params.frequency_penalty or 0.0,
        metadata=dict(params.metadata or {}),
        previous_response_id=params.previous_response_id,
        tool_choice=params.tool_choice if params.tool_choice is not None else "auto",
        tools=tuple(params.tools or ()),
        parallel_tool_calls=True
        if params.parallel_tool_calls is None
        else params.parallel_tool_calls,
        text=params.text if params.text is not None else {"format": {"type": "text"}},
        reasoning=params.reasoning,
        user=params.user,
        conversation_id=conversation_id(params.conversation),
        truncation=params.truncation or "disabled",
        max_tool_calls=params.max_tool_calls,
        safety_identifier=params.safety_identifier,
        prompt_cache_key=params.prompt_cache_key,
        prompt_cache_retention=params.prompt_cache_retention,
        include=tuple(params.include),
    )
