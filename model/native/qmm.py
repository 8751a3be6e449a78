"""Quantized models on the CPU through mlxcel's own quantized matmul.

MLX's CPU ``quantized_matmul`` is scalar code: for the default model's head it takes
longer at 4 bits than the float32 product through OpenBLAS, so a quantized model would
be slower than the float32 one it is four times smaller than. ``qmm_kernel.c`` reads
each weight block once for all rows of the input, dequantizes it with AVX-512 or AVX2
and multiplies, on every core; ``qmm_ext.cpp`` makes it an MLX primitive so a forward
stays one lazy graph. The kernel is one of the CPU kernels ``kernels.py`` loads.

:func:`install_quantized_forms` switches a loaded model's ``QuantizedLinear`` and
``QuantizedEmbedding`` modules to subclasses whose products go to the kernel, when MLX
runs on the CPU and the kernel could be built; on an Apple GPU, MLX's own Metal
kernels stay. Inputs the kernel does not take (another dtype, mode, bits or group
size) go to MLX's own function, so the switch never changes what a model computes
beyond float32 rounding.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx.nn.layers.quantized import QuantizedEmbedding, QuantizedLinear

from mlxcel.model.native.cpu_forms import on_cpu
from mlxcel.model.native.kernels import current_module, load_kernels


def _product(x: mx.array, layer: Any) -> mx.array | None:
    """``x @ dequantize(layer).T`` on the kernel, or None when the kernel does not take it
    (no kernel, another dtype or mode, bits or group size): then MLX's own function does."""
    module = current_module()
    biases = layer.get("biases")
    takes = (
        module is not None
        and layer.mode == "affine"
        and biases is not None
        and x.dtype == mx.float32
        and layer["scales"].dtype == mx.float32
        and biases.dtype == mx.float32
        and module.supports(layer.bits, layer.group_size)
    )
    if not takes or module is None:
        return None
    y: mx.array = module.quantized_matmul(
        x, layer["weight"], layer["scales"], biases, layer.group_size, layer.bits
    )
    return y


class CpuQuantizedLinear(QuantizedLinear):
    """``QuantizedLinear`` whose product runs on mlxcel's CPU kernel."""

    def __call__(self, x: mx.array) -> mx.array:
        y = _product(x, self)
        if y is None:
            return super().__call__(x)  # type: ignore[no-untyped-call, no-any-return]
        return y + self["bias"] if "bias" in self else y


class CpuQuantizedEmbedding(QuantizedEmbedding):
    """``QuantizedEmbedding`` whose ``as_linear`` (a tied head) runs on the CPU kernel."""

    def as_linear(self, x: mx.array) -> mx.array:
        y = _product(x, self)
        if y is None:
            return super().as_linear(x)  # type: ignore[no-untyped-call, no-any-return]
        return y


_SWITCH: dict[type, type] = {
    QuantizedLinear: CpuQuantizedLinear,
    QuantizedEmbedding: CpuQuantizedEmbedding,
}


def install_quantized_forms(model: Any) -> int:
    """Send ``model``'s quantized products to the CPU kernel; returns how many modules.

    Only on the CPU device and only when the kernel is available; a module already
    switched, or of a class that only derives from MLX's, is left as it is.
    """
    if not on_cpu() or not load_kernels().available:
        return 0
    switched = 0
    for _, module in model.named_modules():
        target = _SWITCH.get(type(module))
        if target is not None:
            module.__class__ = target
            switched += 1
    return switched


def uninstall_quantized_forms(model: Any) -> None:
    """Give ``model``'s switched modules back MLX's own classes (for comparisons)."""
    back = {v: k for k, v in _SWITCH.items()}
    for _, module in model.named_modules():
        original = back.get(type(module))
        if original is not None:
            module.__class__ = original
