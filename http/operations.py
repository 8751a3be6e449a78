"""What the OpenAPI document (`http/openapi.py`) says about each view: its summary, tag,
what a 200 answers, its request body and the errors it may answer besides the usual.

Every mounted view has its row (`tests/http/test_openapi.py` holds it), so a route added
without one is caught rather than documented by a fallback.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from mlxcel.http.chat_schemas import ChatCompletionBody, CompletionBody
from mlxcel.http.messages_schemas import CountTokensBody, MessagesBody
from mlxcel.http.schemas import (
    CompactBody,
    ConversationCreateBody,
    ConversationItemsBody,
    ConversationUpdateBody,
    CreateResponseBody,
    InputTokensBody,
    ModelAction,
)


@dataclass(frozen=True, slots=True)
class Operation:
    """What the document says about one view (mounted with and without `/v1`)."""

    summary: str
    tag: str
    returns: str
    """What a 200 answers."""
    body: type[BaseModel] | None = None
    body_required: bool = True
    pages: bool = False
    """Takes the cursor-page query parameters."""
    refusals: tuple[str, ...] = ()
    """Error statuses besides those of a bad request, an API key and an id not found."""
    streams: bool = False
    public: bool = False
    """Answers without an API key."""
    content: str = "application/json"
    """The media type of a 200."""
    anthropic: bool = False
    """Answers in Anthropic's wire format: its errors are `AnthropicError`s."""
    query: tuple[tuple[str, str, str], ...] = ()
    """Its own query parameters: (name, JSON type, description)."""


OPERATIONS: dict[str, Operation] = {
    "health": Operation(
        "Readiness and slot usage",
        "server",
        '`{"status": "ok", "slots": {"total", "busy", "queued"}}` once the model is loaded.',
        refusals=("503",),
        public=True,
    ),
    "metrics": Operation(
        "Metrics in the Prometheus text format",
        "server",
        "Requests, slots, the waiting line, jobs, the store's tables, tokens and latencies; "
        "without an API key only when the server runs with `--metrics-public`.",
        content="text/plain",
    ),
    "openapi_document": Operation("This OpenAPI document", "server", "The OpenAPI 3.1 document."),
    "root": Operation(
        "The server's name and version",
        "server",
        '`{"name": "mlxcel", "version"}`; `HEAD /` answers 200 too (clients probe it).',
        public=True,
    ),
    "models": Operation(
        "List the configured models",
        "models",
        "A list of every model the server may load, each with its `state` (`loaded`, "
        "`loading`, `unloading`, `unloaded`); in Anthropic's shape (`data`, `has_more`, "
        "`first_id`, `last_id`) when the request carries `anthropic-version`.",
    ),
    "load_model": Operation(
        "Load a configured model (an admin key's)",
        "models",
        "The `model` object once it is loaded (another unloaded at `--max-loaded-models`).",
        refusals=("403", "429", "503"),
    ),
    "unload_model": Operation(
        "Unload a model once its work has drained (an admin key's)",
        "models",
        "The `model` object once it is unloaded.",
        refusals=("403", "409", "429"),
    ),
    "load_named_model": Operation(
        "Load a configured model (llama.cpp's form; an admin key's)",
        "models",
        'The `model` object once it is loaded, with `"success": true`.',
        body=ModelAction,
        refusals=("403", "429", "503"),
    ),
    "unload_named_model": Operation(
        "Unload a model (llama.cpp's form; an admin key's)",
        "models",
        'The `model` object once it is unloaded, with `"success": true`.',
        body=ModelAction,
        refusals=("403", "409", "429"),
    ),
    "retrieve_model": Operation(
        "Retrieve the loaded model by a name it answers to",
        "models",
        "The `model` object (Anthropic's with `anthropic-version`).",
    ),
    "create_message": Operation(
        "Create a message (Anthropic's Messages API)",
        "messages",
        "The `message` object, or with `stream: true` its named server-sent events.",
        body=MessagesBody,
        refusals=("404", "429", "503", "529"),
        streams=True,
        anthropic=True,
    ),
    "count_message_tokens": Operation(
        "Count the input tokens of a message body (Anthropic's Messages API)",
        "messages",
        '`{"input_tokens": N}`.',
        body=CountTokensBody,
        refusals=("404", "429", "503"),
        anthropic=True,
    ),
    "create_response": Operation(
        "Create a response",
        "responses",
        "The `response` object, or with `stream: true` its server-sent events.",
        body=CreateResponseBody,
        refusals=("404", "429", "503"),
        streams=True,
    ),
    "create_chat_completion": Operation(
        "Create a chat completion",
        "chat",
        "The `chat.completion` object, or with `stream: true` its `chat.completion.chunk`s "
        "ending with `data: [DONE]`.",
        body=ChatCompletionBody,
        refusals=("404", "429", "503"),
        streams=True,
    ),
    "create_completion": Operation(
        "Create a completion of a raw prompt",
        "completions",
        "The `text_completion` object, or with `stream: true` its chunks ending with "
        "`data: [DONE]`.",
        body=CompletionBody,
        refusals=("404", "429", "503"),
        streams=True,
    ),
    "count_input_tokens": Operation(
        "Count the input tokens of a create body",
        "responses",
        '`{"object": "response.input_tokens", "input_tokens": N}`.',
        body=InputTokensBody,
        refusals=("404", "429", "503"),
    ),
    "compact_history": Operation(
        "Compact a history",
        "responses",
        "A `response.compaction` object: the kept items, the preserved turns and one "
        "`compaction` item.",
        body=CompactBody,
        refusals=("404", "429", "503"),
    ),
    "retrieve_response": Operation(
        "Retrieve a stored response, or stream a background one's events again",
        "responses",
        "The response; with the query `stream=true` (a background response only), its "
        "server-sent events numbered above `starting_after` (all without it), as first "
        "written, then the live ones until its end.",
        streams=True,
        query=(
            ("stream", "boolean", "`true`: the background response's events (SSE)."),
            ("starting_after", "integer", "With `stream`: send the events numbered above."),
            ("include_obfuscation", "boolean", "Accepted; no padding is ever added."),
        ),
    ),
    "delete_response": Operation(
        "Delete a stored response", "responses", '`{"id", "object": "response.deleted"}`.'
    ),
    "cancel_response": Operation(
        "Cancel a queued or running response", "responses", "The response, as it ended."
    ),
    "list_input_items": Operation(
        "List a response's input items", "responses", "A page of items.", pages=True
    ),
    "create_conversation": Operation(
        "Create a conversation",
        "conversations",
        "The `conversation` object.",
        body=ConversationCreateBody,
        body_required=False,
    ),
    "retrieve_conversation": Operation(
        "Retrieve a conversation", "conversations", "The `conversation` object."
    ),
    "update_conversation": Operation(
        "Replace a conversation's metadata",
        "conversations",
        "The `conversation` object.",
        body=ConversationUpdateBody,
    ),
    "delete_conversation": Operation(
        "Delete a conversation", "conversations", '`{"id", "object": "conversation.deleted"}`.'
    ),
    "list_conversation_items": Operation(
        "List a conversation's items", "conversations", "A page of items.", pages=True
    ),
    "create_conversation_items": Operation(
        "Add items to a conversation",
        "conversations",
        "A list of the added items.",
        body=ConversationItemsBody,
    ),
    "retrieve_conversation_item": Operation(
        "Retrieve a conversation item", "conversations", "The item."
    ),
    "delete_conversation_item": Operation(
        "Delete a conversation item", "conversations", "The `conversation` object."
    ),
}
