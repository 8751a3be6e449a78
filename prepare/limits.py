"""Early limits on a request's input: what cannot possibly fit the context window is a
400 before it is rendered, tokenised or hashed.

The checks count items and characters only, so they cost one cheap pass (or less) over
an input that might otherwise take seconds to render.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from mlxcel.errors import ContextLengthExceeded
from mlxcel.items import (
    SUMMARY_PREFIX,
    Compaction,
    FunctionCall,
    FunctionCallOutput,
    Item,
    JsonValue,
    Message,
    Reasoning,
    replay,
)

# A token is about four characters of English and fewer of code; only text made almost
# wholly of the longest whitespace or punctuation runs a vocabulary keeps whole could
# average 32. So more than 32 characters per token of the window will not fit it.
CHARS_PER_TOKEN = 32
# Every message, call and call output renders to at least one token (its role or call
# marker) and a client sends at most one reasoning item with each: more than two items
# per token of the window cannot fit it either.
ITEMS_PER_TOKEN = 2


def item_chars(item: Item) -> int:
    """The characters `item` contributes to a rendered prompt, markup aside."""
    match item:
        case Message() | Reasoning():
            return len(item.text)
        case FunctionCall(call_id=call_id, arguments=arguments):
            return len(call_id) + len(item.flat_name) + len(arguments)
        case FunctionCallOutput(call_id=call_id, output=output):
            return len(call_id) + len(output)
        case Compaction(summary=summary, preserved=preserved):
            return len(SUMMARY_PREFIX) + len(summary) + sum(item_chars(i) for i in preserved)


def check_item_count(raw_input: str | Sequence[object], context_length: int) -> None:
    """400 for more input items than could render into the window; cheap, so it runs
    before any other work on the input."""
    _check_count(1 if isinstance(raw_input, str) else len(raw_input), context_length)


def _check_count(count: int, context_length: int) -> None:
    limit = ITEMS_PER_TOKEN * context_length
    if count > limit:
        raise ContextLengthExceeded(
            f"The input has {count} items; at most {limit} can fit the "
            f"{context_length}-token context window.",
            tokens=-(-count // ITEMS_PER_TOKEN),  # at least this many
            maximum=context_length,
        )


def check_input_size(
    instructions: str | None,
    items: Sequence[Item],
    tools: Sequence[dict[str, JsonValue]] | None,
    context_length: int,
) -> None:
    """400 for an input (history included) that cannot fit the window, before it is
    rendered: too many items, or too many characters (see `CHARS_PER_TOKEN`)."""
    replayed = replay(items)
    _check_count(len(replayed), context_length)
    chars = len(instructions or "") + sum(item_chars(i) for i in replayed)
    if tools:
        chars += len(json.dumps(tools))
    limit = CHARS_PER_TOKEN * context_length
    if chars > limit:
        raise ContextLengthExceeded(
            f"The input has {chars} characters; at most {limit} can fit the "
            f"{context_length}-token context window.",
            tokens=-(-chars // CHARS_PER_TOKEN),  # at least this many
            maximum=context_length,
        )
