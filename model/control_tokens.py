"""Control tokens never reach a reply's text.

A tokenizer's added tokens flagged special are the chat format's own markup
(`<|im_start|>`, `<|vision_start|>`, `<|fim_prefix|>`, …). Sampled in a reply, they
would be decoded into the client's text, and one like `<|im_start|>` opens a turn the
client never asked for. So: the model's end tokens end the turn (the engine's stop set),
and every other special token is masked out of sampling, its logit set to -inf before
the draw, so the distribution over the rest is renormalised as if it were not in the
vocabulary (a `logit_bias` cannot bring one back). The markers the server itself reads
in a reply (tool-call and reasoning tags, `respond/`) stay, even where a tokenizer flags
them special: they become items, not text.

Import this module only on the model thread, after `load_fast_blas()`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import mlx.core as mx
import numpy as np

from mlxcel.respond.reasoning import END_THINK, THINK
from mlxcel.respond.tool_parsers.hermes import CLOSE, OPEN
from mlxcel.respond.tool_parsers.llama3 import PYTHON_TAG
from mlxcel.respond.tool_parsers.mistral import ARGS, CALL_ID, TOOL_CALLS

READ_MARKUP = frozenset({OPEN, CLOSE, THINK, END_THINK, PYTHON_TAG, TOOL_CALLS, ARGS, CALL_ID})
"""Special tokens a reply may hold: the server turns them into calls and reasoning."""


def control_token_ids(tokenizer: Any, ends: Iterable[int]) -> frozenset[int]:
    """The ids of `tokenizer`'s (a Hugging Face tokenizer's) added tokens flagged special,
    less the end tokens `ends` and the markup the server reads."""
    added: Mapping[int, Any] = getattr(tokenizer, "added_tokens_decoder", None) or {}
    special = {
        token_id
        for token_id, token in added.items()
        if getattr(token, "special", False) and getattr(token, "content", None) not in READ_MARKUP
    }
    return frozenset(special - set(ends))


class ControlMask:
    """Sets the control tokens' logits to -inf in every row of a batch."""

    def __init__(self, token_ids: Iterable[int]) -> None:
        self._ids = sorted(set(token_ids))
        self._row: mx.array | None = None
        """One `[V]` row to add: 0, and -inf at each control token (built per width)."""

    @property
    def token_ids(self) -> tuple[int, ...]:
        return tuple(self._ids)

    def apply(self, logits: mx.array) -> mx.array:
        """`logits` `[B, V]` with the control tokens at -inf (the same array when there
        are none). Adding -inf keeps a grammar's -inf where it already was."""
        if not self._ids:
            return logits
        width = logits.shape[-1]
        if self._row is None or self._row.shape[0] != width:
            row = np.zeros(width, dtype=np.float32)
            row[[i for i in self._ids if 0 <= i < width]] = -np.inf
            self._row = mx.array(row)
        return logits + self._row
