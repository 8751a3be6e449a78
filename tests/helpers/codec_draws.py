"""What the store codec's tests (`tests/store/test_codec.py`) draw: one strategy per
dataclass of `mlxcel.items`, client JSON that looks like the encoding itself, and the
stored values that hold them."""

from __future__ import annotations

import typing
from typing import Any

from hypothesis import strategies as st

from mlxcel import items
from mlxcel.items import (
    Compaction,
    ContentPart,
    Conversation,
    FunctionCall,
    FunctionCallOutput,
    InputImage,
    InputText,
    Item,
    JsonValue,
    Message,
    OutputText,
    Reasoning,
    Refusal,
    RequestEcho,
    ResponseError,
    ResponseRecord,
    TokenLogprob,
    Usage,
)
from mlxcel.store.codec import VERSION

texts = st.text(max_size=12)
ids = st.none() | st.sampled_from(["msg_1", "fc_2", "rs_3", "$", "v", ""])
statuses = st.sampled_from(typing.get_args(items.ItemStatus))
counts = st.integers(0, 2**53)
logprob_values = st.floats(allow_nan=False)  # -inf is a real logprob; NaN never equals itself

keys = st.sampled_from(["$", "v", "type", "text", "id", "items", "InputText"]) | texts
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats(allow_nan=False, allow_infinity=False)  # the HTTP edge refuses the others
    | texts
    | st.sampled_from(["InputText", "ResponseRecord", "auto"])
)
json_values: st.SearchStrategy[JsonValue] = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=8,
)
# Client JSON that looks like the encoding itself: a tag, a version, a dataclass's shape.
tagged_lookalikes: st.SearchStrategy[JsonValue] = st.fixed_dictionaries(
    {"$": st.sampled_from(["InputText", "Message", "ResponseRecord", "Nope"])},
    optional={"v": st.sampled_from([VERSION, VERSION + 1]), "text": texts, "content": json_values},
)
client_json = json_values | tagged_lookalikes
metadata = st.dictionaries(keys, texts, max_size=3)

input_texts = st.builds(InputText, texts)
token_logprobs = st.builds(
    TokenLogprob,
    texts,
    logprob_values,
    st.lists(st.tuples(texts, logprob_values), max_size=3).map(tuple),
)
output_texts = st.builds(OutputText, texts, st.lists(token_logprobs, max_size=3).map(tuple))
refusals = st.builds(Refusal, texts)
input_images = st.builds(
    InputImage,
    st.none() | texts,
    st.none() | texts,
    st.sampled_from(["auto", "low", "high", ""]),
)
parts: st.SearchStrategy[ContentPart] = st.one_of(input_texts, output_texts, refusals, input_images)
part_tuples = st.lists(parts, max_size=3).map(tuple)

messages = st.builds(
    Message, st.sampled_from(typing.get_args(items.Role)), part_tuples, ids, statuses
)
function_calls = st.builds(
    FunctionCall,
    texts,
    texts,
    texts,
    ids,
    statuses,
    st.none() | st.sampled_from(["crm", "crm__", ""]),
    st.booleans(),
)
function_call_outputs = st.builds(
    FunctionCallOutput, texts, texts, ids, st.none() | part_tuples, st.booleans()
)
reasonings = st.builds(Reasoning, texts, ids, statuses)
flat_items: st.SearchStrategy[Item] = st.one_of(
    messages, function_calls, function_call_outputs, reasonings
)


def _compactions(inner: st.SearchStrategy[Item]) -> st.SearchStrategy[Item]:
    return st.builds(Compaction, texts, st.lists(inner, max_size=3).map(tuple), ids)


all_items: st.SearchStrategy[Item] = st.recursive(flat_items, _compactions, max_leaves=6)
compactions = _compactions(all_items)
item_tuples = st.lists(all_items, max_size=3).map(tuple)

usages = st.builds(Usage, counts, counts, counts, counts, counts)
response_errors = st.builds(ResponseError, texts, texts)
request_echoes = st.builds(
    RequestEcho,
    model=texts,
    instructions=st.none() | texts,
    max_output_tokens=st.none() | counts,
    temperature=st.floats(0, 2) | st.just(1.0),
    top_p=st.floats(0, 1) | st.just(1.0),
    top_logprobs=st.integers(0, 20),
    metadata=metadata,
    previous_response_id=st.none() | texts,
    tool_choice=client_json | st.just("auto"),
    tools=st.lists(client_json, max_size=3).map(tuple),
    parallel_tool_calls=st.booleans(),
    text=client_json | st.just({"format": {"type": "text"}}),
    reasoning=client_json,
    truncation=st.sampled_from(["disabled", "auto"]),
    user=st.none() | texts,
    conversation_id=st.none() | texts,
    max_tool_calls=st.none() | counts,
    safety_identifier=st.none() | texts,
    prompt_cache_key=st.none() | texts,
    prompt_cache_retention=st.none() | st.sampled_from(["in_memory", "24h"]),
    include=st.lists(texts, max_size=2).map(tuple),
)
response_records = st.builds(
    ResponseRecord,
    id=texts,
    created_at=counts,
    status=st.sampled_from(typing.get_args(items.ResponseStatus)),
    echo=request_echoes,
    output=item_tuples,
    usage=st.none() | usages,
    incomplete_reason=st.none() | texts,
    error=st.none() | response_errors,
    completed_at=st.none() | counts,
    input_items=item_tuples,
    tenant=st.sampled_from(["", "key-a"]) | texts,
    store=st.booleans(),
    background=st.booleans(),
)
conversations = st.builds(
    Conversation,
    texts,
    counts,
    metadata,
    item_tuples,
    st.lists(texts, max_size=3).map(tuple),
)

STRATEGIES: dict[type[Any], st.SearchStrategy[Any]] = {
    InputText: input_texts,
    TokenLogprob: token_logprobs,
    OutputText: output_texts,
    Refusal: refusals,
    InputImage: input_images,
    Message: messages,
    FunctionCall: function_calls,
    FunctionCallOutput: function_call_outputs,
    Reasoning: reasonings,
    Compaction: compactions,
    Usage: usages,
    ResponseError: response_errors,
    RequestEcho: request_echoes,
    ResponseRecord: response_records,
    Conversation: conversations,
}
