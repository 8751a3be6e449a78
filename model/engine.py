"""The engine protocol: what the model actor drives, one call at a time, on its thread.

An engine holds sequences. `insert` queues one (its prompt is read in chunks by later
steps). A step has two phases, and the model actor delivers each one's tokens before
running the next: `decode` advances every sequence past its prompt by one token (an
engine may read the step's prompt chunk in that same forward), `prefill` reports the
first token of each prompt the step finished reading (reading the chunk itself when
`decode` did not). `prefilling` says how far the prompts still being read got,
`remove` drops a sequence at any stage, `spill_prompt_cache` writes the prompt cache to
its disk tier, `close` frees all (writing the prompt cache first). The MLX engine and the
deterministic fake both implement it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from mlxcel.generation import ModelInfo, PrefillProgress, PromptCodec, SequenceSpec, TokenStep
from mlxcel.metrics import PromptDiskStats


class Engine(Protocol):
    """The small boundary between the model actor and an engine (insert, step, remove, close),
    so the MLX engine and the deterministic fake plug into the same actor."""

    def insert(self, spec: SequenceSpec) -> None: ...

    def decode(self) -> list[TokenStep]:
        """One token for every sequence past its prompt."""
        ...

    def prefill(self) -> list[TokenStep]:
        """The first token of each prompt the step finished reading."""
        ...

    def prefilling(self) -> list[PrefillProgress]:
        """How far each sequence still reading its prompt got, as of the last phase."""
        ...

    def remove(self, seq_id: int) -> None: ...

    def has_work(self) -> bool: ...

    def idle(self) -> None:
        """Nothing is left to generate: a chance to give cached memory back."""
        ...

    def spill_prompt_cache(self) -> int:
        """Write the prompt cache's entries to its disk tier, if it has one (what an unload
        calls before it closes the engine; `close` does it too); how many were queued."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """What an engine factory returns, on the model thread: the engine and its codec."""

    engine: Engine
    codec: PromptCodec
    info: ModelInfo
    prompt_disk: Callable[[], PromptDiskStats] | None = None
    """The prompt cache's disk tier's counters, when it has one (`/metrics` reads them)."""


class EngineFactory(Protocol):
    """Builds the engine. Called once, on the model actor's thread."""

    def __call__(self) -> LoadedModel: ...
