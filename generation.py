"""The generation vocabulary: what the model, the actors and the edge all speak.

How to sample, the sequences an engine runs and the steps it reports, what a loaded
model is, the codec that renders prompts, and a request ready to generate. It sits at
the bottom beside `items.py`: it imports nothing of mlxcel but the items.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, TypeAlias

import trio

from mlxcel.items import Compaction, ResponseRecord, TokenLogprob

# --- sampling and sequences --------------------------------------------------------

FinishReason: TypeAlias = Literal["stop", "length"]


@dataclass(frozen=True, slots=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """Draw only from the k most likely tokens (0: off); the Messages API sets it."""
    max_tokens: int = 256
    seed: int | None = None
    grammar: str | None = None
    """An llguidance grammar the output must follow (structured output)."""
    logprobs: bool = False
    """Report each token's log-probability ..."""
    top_logprobs: int = 0
    """... and this many most likely alternatives."""
    stop: tuple[str, ...] = ()
    """The reply ends before the first of these strings (the builder finds them in the
    answer text and stops the sequence; the engine never sees them)."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once for each time the sequence generated it."""
    presence_penalty: float = 0.0
    """Subtracted from a token's logit once the sequence has generated it."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, value) pairs added to those tokens' logits at every step."""

    @property
    def adjusts_logits(self) -> bool:
        """Whether penalties or a bias change this sequence's logits (OpenAI's rule:
        `logit[t] += bias[t] - count[t] * frequency_penalty - (count[t] > 0) *
        presence_penalty`, counting the tokens this sequence generated)."""
        return bool(self.frequency_penalty or self.presence_penalty or self.logit_bias)


@dataclass(frozen=True, slots=True)
class SequenceSpec:
    """One sequence to generate: its prompt tokens and how to sample."""

    seq_id: int
    prompt: tuple[int, ...]
    sampling: Sampling
    tenant: str = ""
    """Whose it is: only that tenant's prompt-cache entries may serve it (no tenant can
    learn from `cached_tokens` what another sent)."""


@dataclass(frozen=True, slots=True)
class TokenStep:
    """A sequence produced a token. `text` is the newly decodable text (may be empty);
    `finish` is set on the sequence's last step, after which it is gone from the engine."""

    seq_id: int
    token: int
    text: str
    finish: FinishReason | None = None
    logprob: TokenLogprob | None = None
    cached_tokens: int = 0
    """On a sequence's first step: its prompt tokens whose KV state came from the prefix
    cache instead of being prefilled (0 on later steps)."""
    cache_write_tokens: int = 0
    """On a sequence's first step: its prompt tokens that were prefilled and whose KV state
    the prefix cache keeps for later requests (0 on later steps, or with no cache)."""


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    path: str
    context_length: int
    backend: str
    tool_parser: str = "hermes"
    """The tool-call format the model writes (picked from its chat template)."""
    vision: bool = False
    """Whether the model reads images; without it an image renders as a placeholder."""
    vocab_size: int = 0
    """Token ids run from 0 below this (0: unknown); `logit_bias` may name no other."""


@dataclass(frozen=True, slots=True)
class ModelNames:
    """The names a request's `model` may use for the loaded model: its alias, its folder's
    path or name, and any name matching one of the `--model-alias` glob patterns (a
    client that names models by its own tiers, `claude-*`, reaches the one served)."""

    alias: str
    path: str
    patterns: tuple[str, ...] = ()
    """Shell-style globs (`*`, `?`, `[...]`), matched without regard to case."""

    def matches(self, name: str) -> bool:
        wanted = name.strip().rstrip("/").lower()
        candidates = {self.alias.lower(), self.path.rstrip("/").lower()}
        candidates.add(self.path.rstrip("/").rsplit("/", 1)[-1].lower())
        if wanted in candidates:
            return True
        return any(fnmatch.fnmatchcase(wanted, p.lower()) for p in self.patterns)

    def aliased(self, aliases: Sequence[tuple[str, str]]) -> ModelNames:
        """These names with the `(PATTERN, NAME)` aliases added. One model is served, so
        each NAME must be one of its names: an alias to anything else is a mistake the
        server reports at start (ValueError), not a 404 on every request it would catch."""
        for pattern, target in aliases:
            if not self.matches(target):
                raise ValueError(
                    f"--model-alias {pattern}={target}: {target!r} is not the served model "
                    f"(it answers to {self.alias!r} and its folder's name)"
                )
        fresh = tuple(p for p, _ in aliases if p not in self.patterns)
        return replace(self, patterns=self.patterns + fresh)

    def listed(self) -> list[str]:
        """What a 404 names as available: the alias, then the patterns."""
        return [self.alias, *self.patterns]


class PromptCodec(Protocol):
    """Renders chat messages into prompt tokens; pure Python, safe off the MLX thread."""

    def render(
        self,
        messages: Sequence[dict[str, object]],
        tools: Sequence[dict[str, object]] | None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]: ...

    def encode(self, text: str) -> list[int]:
        """`text` as prompt tokens, with no chat template (a raw completion prompt, whose
        control-token text is the control token: the client writes the whole prompt)."""
        ...

    def opens_reasoning(self, template_kwargs: Mapping[str, Any] | None = None) -> bool:
        """The template's generation prompt already opens a `<think>` block."""
        ...

    def compile_schema(self, schema: Mapping[str, Any]) -> str:
        """The grammar for output valid against `schema`; InvalidRequest when unusable."""
        ...

    def compile_call(self, schema: Mapping[str, Any], parser: str) -> str:
        """The grammar of one forced tool call whose JSON (`name`, `arguments`) is valid
        against `schema`, in the model's own call markup where `parser` has one."""
        ...

    def compile_custom_tools(
        self,
        custom: Sequence[CustomGrammar],
        others: Sequence[str],
        parser: str,
        *,
        call_schema: Mapping[str, Any] | None = None,
        required: bool = False,
    ) -> str | None:
        """The grammar of a reply whose calls to the `custom` tools hold input their
        grammars accept (text and calls to the `others` stay free; `required`: one call,
        those to `others` valid against `call_schema`). None where the model's call
        markup cannot be constrained; InvalidRequest for a grammar that is not valid, or
        that the reply's grammar could not hold where it is enforced."""
        ...


@dataclass(frozen=True, slots=True)
class CustomGrammar:
    """A `custom` tool's input grammar (`format: {"type": "grammar", ...}`)."""

    name: str
    """The (flat) name the model calls it by."""
    syntax: Literal["lark", "regex"]
    definition: str
    param: str
    """Where the request holds it (`tools[3].format`), for a 400."""


@dataclass(frozen=True, slots=True)
class SequenceFailed:
    """The engine raised while this sequence was in it; the sequence is gone."""

    seq_id: int
    message: str


@dataclass(frozen=True, slots=True)
class PrefillProgress:
    """A sequence is still reading its prompt: `read` of its `total` prompt tokens are
    in its KV state (those taken from the prompt cache count as read)."""

    seq_id: int
    read: int
    total: int


ModelEvent = TokenStep | SequenceFailed | PrefillProgress
"""What the model actor reports for a sequence."""


class ModelView(Protocol):
    """The loaded model as those who prepare requests see it: whether it is ready, its
    facts and its codec (`info` and `codec` raise `ModelNotReady` while it loads)."""

    @property
    def ready(self) -> trio.Event: ...

    @property
    def info(self) -> ModelInfo: ...

    @property
    def codec(self) -> PromptCodec: ...


@dataclass(frozen=True, slots=True)
class ServedModel:
    """The loaded model as a request is prepared for it: the names it answers to, its
    facts and its codec, read together once it is ready and passed as one."""

    names: ModelNames
    info: ModelInfo
    codec: PromptCodec


# --- requests ready to generate ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolUse:
    """How the reply may call the request's function tools."""

    names: frozenset[str]
    """The functions the reply may call, by the (flat) name the model sees."""
    required: bool
    """The reply is exactly one call (`tool_choice` "required" or a named function)."""
    parser: str = "hermes"
    """The tool-call format the model writes (a key of `tool_parsers.PARSERS`)."""
    parallel: bool = True
    """Several calls may be made in one reply (`parallel_tool_calls`)."""
    parameters: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Each function's JSON-schema parameters, by flat name."""
    namespaces: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """Flat names of namespaced functions, to (namespace, name)."""
    custom: frozenset[str] = frozenset()
    """Flat names of `custom` tools: their calls are `custom_tool_call`s."""
    max_calls: int | None = None
    """At most this many calls are shown (`max_tool_calls`); later ones are ignored."""
    held: frozenset[str] = frozenset()
    """Custom tools whose grammar the reply's grammar enforces on their tagged calls: a
    reply that is only a bare JSON call to one of them is text, not a call."""


@dataclass(frozen=True, slots=True)
class CompactionReport:
    """The history was compacted before generating (`context_management`)."""

    item: Compaction
    tokens_before: int
    tokens_after: int


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """A validated, rendered request: everything the scheduler needs to run it."""

    record: ResponseRecord
    """The response as created: id, created_at, echo, input items; status in_progress."""
    prompt: tuple[int, ...]
    sampling: Sampling
    tools: ToolUse | None = None
    reasoning_opened: bool = False
    """The chat template's generation prompt already opened a `<think>` block."""
    echo_prefix: str | None = None
    """Where the reasoning-echo cache files this response's reasoning (None: not at all)."""
    signs_reasoning: bool = False
    """Each reasoning trace of the reply is handed out with its signature, so it is also
    filed under it (`store/echo.py`: `trace_signature`, `signed_key`)."""
    compaction: CompactionReport | None = None
    """The compaction the prompt was rendered with; its item leads the output."""
    prelude: Prelude | None = None
    """Work the slot does first (compaction): it yields the request to generate, under
    the same id, once a slot has taken this one; `prompt` is then the uncompacted one."""
    truncated_items: int = 0
    """Rendered items `truncation: "auto"` dropped so the prompt fits the window."""
    spend: SpendTokens | None = None
    """Charges the response's input and output tokens to the key that asked for it
    (its token limits), once the response has ended; None when no limit counts them."""


class SpendTokens(Protocol):
    """Charges tokens to the key a request came with. `final` once the request has ended:
    what it reserved when it was admitted and did not spend is returned then. Not
    `final`: tokens spent on its behalf before (a summary its slot ran first)."""

    async def __call__(self, tokens: int, *, final: bool = True) -> None: ...


GenerateText = Callable[[GenerationRequest], Awaitable[ResponseRecord]]
"""Runs a request to its end and answers its final record (a compaction's summary)."""


class Prelude(Protocol):
    """A phase of generation run in the response's own slot before its tokens: given a
    way to generate there, it answers the request to generate (same record id)."""

    async def __call__(self, generate: GenerateText) -> GenerationRequest: ...
