"""What a prompt-cache file's KV state must be for this model, and the state it becomes.

The disk tier (`disk.py`) keeps files per model identity (`Identity`: the model and
its chat template) and checks every file it reads against the model's KV layout
(`Layout`) and the data checksum before the state is used (`kv_caches`): nothing in a
file is trusted. Runs on the model thread (it calls MLX).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from mlxcel.model.cache import private, spill_file

NAMES = {mx.float32: "float32", mx.float16: "float16", mx.bfloat16: "bfloat16"}
"""The KV dtypes a file may hold, by their names in its metadata."""


@dataclass(frozen=True, slots=True)
class Identity:
    """What a KV state depends on besides its tokens."""

    model: str
    """The model folder and a hash of its config."""
    template: str
    """A hash of the chat template."""

    @property
    def key(self) -> str:
        return spill_file.digest(self.model, self.template)[: private.KEY_DIGITS]


@dataclass(frozen=True, slots=True)
class Layout:
    """The KV state this model makes: layers of `[1, heads, tokens, dim]` arrays."""

    layers: int
    heads: int
    dim: int
    value_dim: int
    dtype: str


def kv_caches(arrays: dict[str, mx.array], lay: Layout, length: int, crc: str) -> list[Any]:
    """The arrays of a file, checked against this model's layout and the file's data
    checksum, as one cache object per layer; ValueError when they do not fit."""
    names = [f"{i}.{p}" for i in range(lay.layers) for p in ("keys", "values")]
    if sorted(arrays) != sorted(names):
        raise ValueError("its tensors are not this model's layers")
    for name in names:
        a, dim = arrays[name], lay.dim if name.endswith("keys") else lay.value_dim
        if tuple(a.shape) != (1, lay.heads, length, dim) or NAMES.get(a.dtype) != lay.dtype:
            raise ValueError(f"tensor {name} has the wrong shape or dtype")
    mx.eval(list(arrays.values()))
    raws = [arrays[n].view(mx.uint16) if lay.dtype == "bfloat16" else arrays[n] for n in names]
    mx.eval(raws)
    if spill_file.data_crc([np.asarray(memoryview(cast(Any, r))) for r in raws]) != crc:
        raise ValueError("its data does not match its checksum")
    caches = []
    for i in range(lay.layers):
        layer: Any = cast(Any, KVCache)()
        layer.keys, layer.values = arrays[f"{i}.keys"], arrays[f"{i}.values"]
        layer.offset = length
        caches.append(layer)
    return caches
