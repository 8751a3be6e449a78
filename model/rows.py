"""The MLX engine's record of one sequence (`Row`) and of a prompt chunk read (`ChunkRead`).

Import this module only on the model thread, after `load_fast_blas()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from mlxcel.generation import Sampling, SequenceSpec
from mlxcel.model.forward import KV
from mlxcel.model.penalties import RowPenalties
from mlxcel.model.sampling import Rng, row_generator


@dataclass
class Row:
    """One sequence, from insert to its last token."""

    spec: SequenceSpec
    detokenizer: Any
    matcher: Any | None
    """The grammar's matcher (structured output), fed every token the row samples."""
    cache: KV | None = None
    """Its own KV state while its prompt is read (None before admission)."""
    cached: int = 0
    """Prompt tokens taken from the prefix cache."""
    read: int = 0
    """Prompt tokens in its KV state (cached ones included)."""
    fed: list[int] = field(default_factory=list)
    """Generated tokens in the decode batch's KV state, in order."""
    last: int = 0
    """The token the next decode step feeds."""
    rng: Rng = field(default_factory=row_generator)  # its own: draws independent of the batch
    penalties: RowPenalties | None = None  # None: the fast path (no penalty, no bias)

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.spec.prompt

    @property
    def sampling(self) -> Sampling:
        return self.spec.sampling

    @property
    def held(self) -> int:
        """Tokens in its KV state once it decodes: the prompt and what it has fed."""
        return len(self.spec.prompt) + len(self.fed)

    @property
    def tokens(self) -> list[int]:
        """The tokens a decoding row's KV state holds."""
        return [*self.spec.prompt, *self.fed]


@dataclass(frozen=True, slots=True)
class ChunkRead:
    """A prompt chunk read in a step: the rows it finished, with their last logits."""

    ended: tuple[int, ...]
    """Sequence ids, in the chunk's order."""
    logits: tuple[mx.array, ...]
