"""What a request asks, as plain values: the one shape preparation reads.

Each wire format (the Responses API, Chat Completions, legacy Completions) turns its validated body into these, so
nothing under `prepare/` knows a schema library or an HTTP route.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from mlxcel.items import Item, ItemReference, JsonValue


@dataclass(frozen=True, slots=True)
class ResponseParams:
    """A request to create a response; `None` means the field was not sent."""

    model: str
    input: tuple[Item, ...]
    """The input items sent in full; `references` name the others."""
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    """Sample only from the k most likely tokens (Anthropic's `top_k`)."""
    top_logprobs: int | None = None
    store: bool | None = None
    background: bool = False
    metadata: Mapping[str, str] = field(default_factory=dict)
    truncation: str | None = None
    tools: tuple[dict[str, JsonValue], ...] | None = None
    tool_choice: str | dict[str, JsonValue] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, JsonValue] | None = None
    reasoning: dict[str, JsonValue] | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, JsonValue] | None = None
    user: str | None = None
    prompt_cache_key: str | None = None
    include: tuple[str, ...] = ()
    max_tool_calls: int | None = None
    """At most this many tool calls in the reply; later ones are not emitted."""
    safety_identifier: str | None = None
    prompt_cache_retention: str | None = None
    chat_template_kwargs: dict[str, JsonValue] | None = None
    compact_threshold: int | None = None
    """Compact first at this many rendered input tokens (`context_management`)."""
    ignored_tools: frozenset[int] = frozenset()
    """Places in `tools` of hosted tools the model does not see (`--hosted-tools ignore`)."""
    references: tuple[ItemReference, ...] = ()
    """`item_reference` entries, each with its place in the input, not yet resolved."""
    stop: tuple[str, ...] = ()
    """The reply ends before the first of these strings."""
    signed: tuple[tuple[int, str], ...] = ()
    """Reasoning items the client sent back with a signature (`store/echo.py`), by their
    place in `input`: the trace filed under it, when there is one, is restored."""
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs (Chat Completions and Completions; the Responses API has
    none, but takes the two penalties)."""
    raw: bool = False
    """The input is one prompt text, tokenised as it stands: no chat template (legacy
    completions)."""
    tenant: str = ""
    """Who asks: the name of the request's API key ("" when the server takes none). It
    owns what the request stores, and its prompt-cache and reasoning-echo entries."""


@dataclass(frozen=True, slots=True)
class CompactionParams:
    """A request to compact a history (`/responses/compact`): its input, and the chain
    it continues."""

    model: str
    input: tuple[Item, ...]
    """The input items sent in full; `references` name the others."""
    references: tuple[ItemReference, ...] = ()
    instructions: str | None = None
    """What the summary must keep, besides the default goals, decisions and next steps."""
    previous_response_id: str | None = None
    keep_tokens: int | None = None
    """Tokens of the newest turns preserved as they are (a default when None)."""
    max_output_tokens: int | None = None
    """The summary's budget (a default when None)."""
    tenant: str = ""
    """Who asks; only its own stored responses can be continued."""
