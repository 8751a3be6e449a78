"""Quantized models on the CPU through mlxcel's own quantized matmul.

MLX's CPU ``quantized_matmul`` is scalar code: for the default model's head it takes
longer at 4 bits than the float32 product through OpenBLAS, so a quantized model would
be slower than the float32 one it is four times smaller than. ``qmm_kernel.c`` reads
each weight block once for all rows of the input, dequantizes it with AVX-512 or AVX2
and multiplies, on every core; ``qmm_ext.cpp`` makes it an MLX primitive so a forward
stays one lazy graph.

:func:`install_quantized_forms` switches a loaded model's ``QuantizedLinear`` and
``QuantizedEmbedding`` modules to subclasses whose products go to the kernel, when MLX
runs on the CPU and the kernel could be built; on an Apple GPU, MLX's own Metal
kernels stay. Inputs the kernel does not take (another dtype, mode, bits or group
size) go to MLX's own function, so the switch never changes what a model computes
beyond float32 rounding.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import mlx.core as mx
from mlx.nn.layers.quantized import QuantizedEmbedding, QuantizedLinear

from mlxcel.model.blas_build import ShimBuildError
from mlxcel.model.cpu_forms import on_cpu
from mlxcel.model.qmm_build import MODULE, QmmBuildError, build, choose_isa

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QmmStatus:
    """Whether the kernel is available, and why not when it is not."""

    module: ModuleType | None
    isa: str | None
    note: str

    @property
    def available(self) -> bool:
        return self.module is not None


_lock = threading.Lock()
_status: QmmStatus | None = None


def load_qmm() -> QmmStatus:
    """Build (once per machine) and import the extension; never raises.

    When it cannot be had (a CPU with neither AVX-512 nor AVX2, no compiler, a failed
    build, ``MLXCEL_QMM_ISA=off``), the status says why, it is logged once, and
    quantized models keep MLX's own quantized matmul.
    """
    global _status
    with _lock:
        if _status is None:
            _status = _load()
            if _status.available:
                log.info("Quantized matmul: mlxcel's CPU kernel (%s)", _status.isa)
            else:
                log.warning("Quantized matmul: MLX's own (%s)", _status.note)
        return _status


def _load() -> QmmStatus:
    try:
        isa = choose_isa()
    except QmmBuildError as exc:
        return QmmStatus(None, None, str(exc))
    if isa is None:
        return QmmStatus(None, None, "the CPU has neither AVX-512 nor AVX2, or MLXCEL_QMM_ISA=off")
    try:
        built = build(isa)
        module = _import(built.path)
        _self_check(module)
    except (QmmBuildError, ShimBuildError, ImportError, OSError, TypeError, ValueError) as exc:
        return QmmStatus(None, None, f"the {isa} kernel could not be built or loaded: {exc}")
    return QmmStatus(module, isa, f"{isa} kernel")


def _self_check(module: ModuleType) -> None:
    """One small product against MLX's own, so a kernel that cannot be used is never used.

    An extension built against another nanobind ABI than MLX's raises TypeError here
    (it cannot take MLX's arrays); a miscompiled kernel gives other numbers.
    """
    weights = mx.random.normal((37, 64), key=mx.random.key(0))
    x = mx.random.normal((3, 64), key=mx.random.key(1))
    w, scales, biases = mx.quantize(weights, group_size=32, bits=4)
    ours = module.quantized_matmul(x, w, scales, biases, 32, 4)
    theirs = mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size=32, bits=4)
    if not mx.allclose(ours, theirs, rtol=1e-4, atol=1e-4).item():
        raise ValueError("the kernel's self-check product differs from MLX's")


def _import(path: Any) -> ModuleType:
    spec = importlib.util.spec_from_file_location(MODULE, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _product(x: mx.array, layer: Any) -> mx.array | None:
    """``x @ dequantize(layer).T`` on the kernel, or None when the kernel does not take it
    (no kernel, another dtype or mode, bits or group size): then MLX's own function does."""
    status = _status
    module = status.module if status is not None else None
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
    if not on_cpu() or not load_qmm().available:
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
