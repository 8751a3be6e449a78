"""The engine protocol: what the model actor drives, one call at a time, on its thread.

An engine holds sequences. `insert` queues one (its prompt is prefilled in chunks by
later steps), `step` advances every sequence by at most one token (plus one prefill
chunk) and reports what happened, `prefilling` says how far
the prompts still being read got, `remove` drops one at any stage, `close` frees all.
The MLX engine and the deterministic fake both implement it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from mlxcel.generation import ModelInfo, PrefillProgress, PromptCodec, SequenceSpec, TokenStep


class Engine(Protocol):
    def insert(self, spec: SequenceSpec) -> None: ...

    def step(self) -> list[TokenStep]: ...

    def prefilling(self) -> list[PrefillProgress]:
        """How far each sequence still reading its prompt got, as of the last step."""
        ...

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
