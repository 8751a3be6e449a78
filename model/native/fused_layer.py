"""A transformer layer's work around attention as two native nodes: the fused layer.

At a few rows a decode step's weight products are only half its time: the rest is ~20
small MLX operations a layer (norms, bias adds, reshapes, RoPE, residuals), each a graph
node with its own dispatch. ``layer_head`` (input norm, QKV projections with their biases,
qwen3's per-head norms, RoPE) and ``layer_tail`` (output projection, residual, norm, SwiGLU
MLP, residual) do that work in C between direct calls of the quantized matmul
(``layer_kernel.c``); attention and the KV cache stay as they are.

:func:`plan_layers` reads a loaded model once: for each layer, the arrays its modules
already hold (the same arrays: no copy of the weights) and their parameters. It gives
None, with the reason, for anything the kernels do not compute exactly as the modules do:
MLX on a GPU, kernels unavailable, unquantized or non-affine weights, another RoPE than
``nn.RoPE``, another norm than ``nn.RMSNorm``. :func:`choose` adds the switch
``MLXCEL_FUSED_LAYER`` (``1`` on where it applies; unset or ``0``: off) and logs which path
runs, once per loaded model. Off by default: it costs less CPU a step at one and at eight
rows, but on two shared cores its wall-clock step at eight rows was not shorter
(``docs/benchmarks.md``, "The fused layer").
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx.nn.layers.normalization import RMSNorm
from mlx.nn.layers.positional_encoding import RoPE
from mlx.nn.layers.quantized import QuantizedLinear

from mlxcel.model.native.kernels import current_module

log = logging.getLogger(__name__)

SWITCH = "MLXCEL_FUSED_LAYER"
"""``1`` uses the fused layer where it applies; unset or ``0`` keeps the composed one."""


@dataclass(frozen=True, slots=True)
class Linears:
    """Some quantized linear maps as the kernels take them: (packed w, scales, biases) per
    map, in order; the additive biases of the maps whose bit is set in ``bias_mask``."""

    weights: tuple[mx.array, ...]
    biases: tuple[mx.array, ...]
    bias_mask: int
    bits: tuple[int, ...]
    groups: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LayerPlan:
    """One layer's arrays (its modules' own) and parameters."""

    input_norm: mx.array
    eps: float
    head: Linears
    qk_norms: tuple[mx.array, ...]
    qk_eps: float
    q_heads: int
    kv_heads: int
    head_dim: int
    rope: RoPE
    post_norm: mx.array
    post_eps: float
    tail: Linears


@dataclass(frozen=True, slots=True)
class FusedLayers:
    """Every layer's plan, and the kernels' module that runs them."""

    layers: tuple[LayerPlan, ...]
    kernels: Any

    def head(self, index: int, h: mx.array, positions: mx.array) -> list[mx.array]:
        """Layer ``index``'s q ``[T, Hq, D]``, k and v ``[T, Hkv, D]`` for ``h`` ``[T, dim]``,
        each token rotated at its position (``positions``: int32 ``[T]``)."""
        p = self.layers[index]
        rope = p.rope
        out: list[mx.array] = self.kernels.layer_head(
            h, positions, p.input_norm, list(p.head.weights), list(p.head.biases),
            p.head.bias_mask, list(p.qk_norms), list(p.head.bits), list(p.head.groups),
            p.q_heads, p.kv_heads, p.head_dim, p.eps, p.qk_eps, rope.dims, rope.base,
            rope.scale, rope.traditional,
        )  # fmt: skip
        return out

    def tail(self, index: int, h: mx.array, attn: mx.array) -> mx.array:
        """Layer ``index``'s output ``[T, dim]`` from its input and attention ``[T, Hq * D]``."""
        p = self.layers[index]
        t = p.tail
        out: mx.array = self.kernels.layer_tail(
            h, attn, p.post_norm, list(t.weights), list(t.biases), t.bias_mask,
            list(t.bits), list(t.groups), p.post_eps,
        )  # fmt: skip
        return out


class Unfusable(Exception):
    """A model (or this process) the fused layer does not serve; the message says why."""


def _linears(modules: Sequence[Any], kernels: Any) -> Linears:
    weights: list[mx.array] = []
    biases: list[mx.array] = []
    mask = 0
    for i, m in enumerate(modules):
        if not isinstance(m, QuantizedLinear) or m.mode != "affine" or m.get("biases") is None:
            raise Unfusable("its projections are not affine-quantized")
        if m["scales"].dtype != mx.float32 or not kernels.supports(m.bits, m.group_size):
            raise Unfusable(f"{m.bits}-bit weights in groups of {m.group_size} are not taken")
        weights += [m["weight"], m["scales"], m["biases"]]
        if "bias" in m:
            biases.append(m["bias"])
            mask |= 1 << i
    return Linears(
        tuple(weights), tuple(biases), mask, tuple(m.bits for m in modules),
        tuple(m.group_size for m in modules),
    )  # fmt: skip


def _norm(module: Any) -> tuple[mx.array, float]:
    if type(module) is not RMSNorm or module.weight.dtype != mx.float32:
        raise Unfusable("a norm is not a float32 RMSNorm")
    return module.weight, float(module.eps)


def _layer(layer: Any, kernels: Any) -> LayerPlan:
    attn, mlp = layer.self_attn, layer.mlp
    if type(attn.rope) is not RoPE:
        raise Unfusable(f"its RoPE is {type(attn.rope).__name__}, not nn.RoPE")
    if not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
        raise Unfusable("its MLP is not gate/up/down")
    head = _linears([attn.q_proj, attn.k_proj, attn.v_proj], kernels)
    head_dim = head.weights[0].shape[0] // attn.n_heads
    qk_norms: tuple[mx.array, ...] = ()
    qk_eps = 1e-6
    if hasattr(attn, "q_norm"):
        (q_norm, qk_eps), (k_norm, _) = _norm(attn.q_norm), _norm(attn.k_norm)
        qk_norms = (q_norm, k_norm)
    if attn.rope.dims > head_dim or attn.rope.dims % 2:
        raise Unfusable("its RoPE turns another width than a head's")
    input_norm, eps = _norm(layer.input_layernorm)
    post_norm, post_eps = _norm(layer.post_attention_layernorm)
    tail = _linears([attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj], kernels)
    return LayerPlan(
        input_norm, eps, head, qk_norms, qk_eps, attn.n_heads, attn.n_kv_heads, head_dim,
        attn.rope, post_norm, post_eps, tail,
    )  # fmt: skip


def plan_layers(model: Any) -> FusedLayers:
    """The fused plan of a loaded model whose forward ``flat_forward`` flattens; raises
    :class:`Unfusable` with the reason when the kernels would not compute what it does."""
    if mx.default_device().type != mx.DeviceType.cpu:
        raise Unfusable("MLX runs on its GPU")
    kernels = current_module()
    if kernels is None or not hasattr(kernels, "layer_head"):
        raise Unfusable("the CPU kernels are not loaded")
    layers = model.model.layers
    return FusedLayers(tuple(_layer(layer, kernels) for layer in layers), kernels)


def choose(model: Any, flat: bool) -> FusedLayers | None:
    """The fused plan when ``MLXCEL_FUSED_LAYER=1`` asks for it and it applies; logs which
    layer runs in one line. ``flat``: ``flat_forward`` supports the model."""
    wanted = os.environ.get(SWITCH, "").strip()
    if wanted != "1":
        why = f"{SWITCH}=0" if wanted == "0" else f"the default; {SWITCH}=1 fuses"
        log.info("Layers: composed MLX operations (%s)", why)
        return None
    try:
        if not flat:
            raise Unfusable("its blocks are not ones the flattened forward runs")
        plan = plan_layers(model)
    except Unfusable as why:
        log.info("Layers: composed MLX operations (the fused layer does not apply: %s)", why)
        return None
    log.info("Layers: fused (one native head and tail per layer, %d layers)", len(plan.layers))
    return plan
