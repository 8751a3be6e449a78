"""The engine protocol: what the model actor drives, one call at a time, on its thread.

An engine holds sequences. `insert` queues one (its prompt is prefilled in chunks by
later steps), `step` advances every sequence by at most one token (plus one prefill
chunk) and reports what happened, `remove` drops one at any stage, `close` frees all.
The MLX engine and the deterministic fake both implement it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeAlias

from mlxcel.items import TokenLogprob

FinishReason: TypeAlias = Literal["stop", "length"]


@dataclass(frozen=True, slots=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int | None = None
    grammar: str | None = None
    """An llguidance grammar the output must follow (structured output)."""
    logprobs: bool = False
    """Report each token's log-probability ..."""
    top_logprobs: int = 0
    """... and this many most likely alternatives."""


@dataclass(frozen=True, slots=True)
class SequenceSpec:
    """One sequence to generate: its prompt tokens and how to sample."""

    seq_id: int
    prompt: tuple[int, ...]
    sampling: Sampling


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


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    path: str
    context_length: int
    backend: str
    tool_parser: str = "hermes"
    """The tool-call format the model writes (picked from its chat template)."""


class PromptCodec(Protocol):
    """Renders chat messages into prompt tokens; pure Python, safe off the MLX thread."""

    def render(
        self,
        messages: Sequence[dict[str, object]],
        tools: Sequence[dict[str, object]] | None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]: ...

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


class Engine(Protocol):
    def insert(self, spec: SequenceSpec) -> None: ...

    def step(self) -> list[TokenStep]: ...

    def remove(self, seq_id: int) -> None: ...

    def has_work(self) -> bool: ...

    def idle(self) -> None:
        """Nothing is left to generate: a chance to give cached memory back."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """What an engine factory returns, on the model thread: the engine and its codec."""

    engine: Engine
    codec: PromptCodec
    info: ModelInfo


class EngineFactory(Protocol):
    """Builds the engine. Called once, on the model actor's thread."""

    def __call__(self) -> LoadedModel: ...
