"""Faster, numerically equivalent forms of MLX's transcendental-heavy ops, for the CPU.

Attention and SwiGLU go to mlxcel's compiled CPU kernels (``attn_kernel.c``: blockwise
attention with an online softmax and a vectorised exp, on every core; loaded by
``kernels.py``) when they are available; the composed MLX forms below are the fallback.

MLX's CPU backend evaluates ``exp`` and ``sigmoid`` with scalar code (about 22 and
29 ns an element on this kind of machine) while ``power(2, x)`` is vectorised (about
8 ns) and a multiply costs about 1 ns. A decode step of a batch spends most of its
non-GEMM time in SiLU and in the softmax (and the boolean ``where`` of the mask) of
MLX's composed attention fallback, and a sampler's ``logsumexp`` over the vocabulary
is the same story. Writing ``exp(x)`` as ``power(2, x * log2(e))`` gives the same
results within float32 rounding at a fraction of the cost.

The forms here keep the exact signatures of the functions they stand in for:

- :func:`fast_swiglu` for ``mlx_lm.models.activations.swiglu``;
- :func:`fast_sdpa` for ``mlx_lm.models.base.scaled_dot_product_attention`` (float32,
  unquantized caches, no attention sinks; anything else goes to the original);
- :func:`fast_log_softmax` for ``logits - logsumexp(logits)`` in samplers.

:func:`install_cpu_forms` gives a loaded mlx-lm model these forms by rebinding the
names ``swiglu`` and ``scaled_dot_product_attention`` in the modules that define the
model's classes, and only when MLX's default device is the CPU: on an Apple GPU MLX's
own fused kernels are faster and stay in place. The rebinding is per Python module, so
it affects every model of that architecture in the process; :func:`uninstall_cpu_forms`
undoes it and :func:`reference_forms` undoes it for the duration of a ``with`` block
(for tests and benchmarks that compare the two).
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
from mlx_lm.models import activations as _activations
from mlx_lm.models import base as _base

from mlxcel.model.native.kernels import current_module, load_kernels

LOG2E = math.log2(math.e)
"""``exp(x) == 2 ** (x * LOG2E)``."""

#: The functions the forms replace, captured at import so that uninstalling (and the
#: fallbacks of :func:`fast_sdpa`) always reach mlx-lm's own code.
REFERENCE_SWIGLU: Callable[[mx.array, mx.array], mx.array] = _activations.swiglu
REFERENCE_SDPA: Callable[..., mx.array] = _base.scaled_dot_product_attention

_FLOAT32_MIN = float(mx.finfo(mx.float32).min)


def _swiglu_body(gate: mx.array, up: mx.array) -> mx.array:
    # silu(g) = g * sigmoid(g) = g / (1 + e^-g). For g << 0 the power overflows to
    # inf and g / inf is a signed zero (silu is below 1e-38 there anyway): finite.
    # Dividing before multiplying by `up` keeps a huge `up` from making inf / inf.
    return gate / (1.0 + mx.power(2.0, gate * -LOG2E)) * up


_swiglu_compiled = mx.compile(_swiglu_body, shapeless=True)


_kernels_enabled = True
"""Whether the forms may use the compiled kernels (see :func:`composed_forms`)."""


def _kernels() -> Any:
    """The compiled CPU kernels' module, or None (not loaded, unavailable or switched off)."""
    return current_module() if _kernels_enabled else None


@contextmanager
def composed_forms() -> Iterator[None]:
    """Run the block with the composed MLX forms instead of the compiled kernels.

    For benchmarks and tests that compare the two; like :func:`reference_forms`, not for
    use while another thread runs a model.
    """
    global _kernels_enabled
    saved, _kernels_enabled = _kernels_enabled, False
    try:
        yield
    finally:
        _kernels_enabled = saved


def fast_swiglu(gate: mx.array, up: mx.array) -> mx.array:
    """``silu(gate) * up``: the compiled kernel for two float32 arrays of one shape, else
    a compiled MLX form with the sigmoid's exponential written as a power of two."""
    kernels = _kernels()
    if (
        kernels is not None
        and gate.dtype == mx.float32
        and up.dtype == mx.float32
        and gate.shape == up.shape
    ):
        out: mx.array = kernels.swiglu(gate, up)
        return out
    return _swiglu_compiled(gate, up)


def _exp_shifted_body(scores: mx.array, row_max: mx.array) -> mx.array:
    return mx.power(2.0, (scores - row_max) * LOG2E)


_exp_shifted = mx.compile(_exp_shifted_body, shapeless=True)


class _MaskMemo:
    """The additive form of the last mask seen, so 24 layers convert it once.

    A model builds one mask per forward and hands the same array object to every
    layer; holding that object (not its id) makes the identity check safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key: object = None
        self._value: mx.array | None = None

    def get(self, key: object, build: Callable[[], mx.array]) -> mx.array:
        with self._lock:
            same = self._key is key or (
                isinstance(key, tuple) and isinstance(self._key, tuple) and self._key == key
            )
            if same and self._value is not None:
                return self._value
        value = build()
        with self._lock:
            self._key, self._value = key, value
        return value


_memo = _MaskMemo()


def _causal_additive(q_len: int, k_len: int) -> mx.array:
    """0 where query i (at position k_len - q_len + i) may see key j, else float32 min."""
    q_pos = mx.arange(k_len - q_len, k_len)[:, None]
    k_pos = mx.arange(k_len)[None]
    return mx.where(q_pos >= k_pos, 0.0, _FLOAT32_MIN).astype(mx.float32)


def _additive_mask(mask: mx.array | str | None, q_len: int, k_len: int) -> mx.array | None:
    """The mask as something to add to the scores (None: nothing to add).

    Adding float32 min to a score gives float32 min (the score is far below half an
    ulp of it), exactly what the reference's ``where(mask, scores, min)`` gives, and an
    add is several times cheaper than a boolean ``where`` on this backend.
    """
    if mask is None:
        return None
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"unsupported attention mask {mask!r}")
        return _memo.get(("causal", q_len, k_len), lambda: _causal_additive(q_len, k_len))
    if mask.dtype == mx.bool_:
        boolean = mask
        return _memo.get(boolean, lambda: mx.where(boolean, 0.0, _FLOAT32_MIN).astype(mx.float32))
    return mask


def _fast_path_applies(queries: Any, keys: Any, values: Any, cache: Any, mask: Any) -> bool:
    if hasattr(cache, "bits"):
        return False
    arrays = (queries, keys, values)
    if not all(isinstance(a, mx.array) and a.dtype == mx.float32 for a in arrays):
        return False
    if isinstance(mask, mx.array) and mask.dtype not in (mx.bool_, mx.float32):
        return False
    if isinstance(mask, str) and mask != "causal":
        return False
    if isinstance(mask, mx.array) and mask.ndim > 4:
        return False
    return bool(queries.ndim == 4 and queries.shape[1] % keys.shape[1] == 0)


def fast_sdpa(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    cache: Any,
    scale: float,
    mask: mx.array | str | None,
    sinks: mx.array | None = None,
) -> mx.array:
    """Attention as mlx-lm's ``scaled_dot_product_attention``: the compiled kernel, else an
    exp2 softmax in composed MLX ops.

    Shapes: queries ``[B, H, L, D]``, keys and values ``[B, Hkv, S, D]`` with ``H`` a
    multiple of ``Hkv``; the mask is None, ``"causal"`` (query ``i`` sees keys up to
    ``S - L + i``), a boolean array (True = attend) or an additive float array, either
    broadcastable to ``[B, H, L, S]``. Grouped queries are reshaped to
    ``[B, Hkv, rep * L, D]`` so each key head serves one larger GEMM; keys and values
    are never repeated. In the composed form, the softmax subtracts the row max, exponentiates as a power of
    two and divides after the product with the values (on ``L x D`` rather than
    ``L x S`` numbers). Quantized caches, attention sinks and non-float32 inputs go to
    the reference function unchanged.
    """
    if sinks is not None or not _fast_path_applies(queries, keys, values, cache, mask):
        return REFERENCE_SDPA(
            queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks
        )
    kernels = _kernels()
    if kernels is not None and keys.shape[2] > 0 and keys.shape[0] == queries.shape[0]:
        if mask is None or isinstance(mask, str):
            out: mx.array = kernels.attention(queries, keys, values, scale, causal=mask is not None)
        else:
            out = kernels.attention(queries, keys, values, scale, mask=mask)
        return out
    return _composed_sdpa(queries, keys, values, scale, mask)


def _composed_sdpa(
    queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask: mx.array | str | None
) -> mx.array:
    """:func:`fast_sdpa` in composed MLX ops, for when the compiled kernel is not there."""
    batch, heads, q_len, dim = queries.shape
    kv_heads, k_len = keys.shape[1], keys.shape[2]
    rep = heads // kv_heads
    q = (queries * scale).reshape(batch, kv_heads, rep * q_len, dim)
    scores = (q @ keys.swapaxes(-1, -2)).reshape(batch, kv_heads, rep, q_len, k_len)
    additive = _additive_mask(mask, q_len, k_len)
    if additive is not None:
        if additive.ndim >= 3 and rep > 1:
            if additive.shape[-3] == 1:
                additive = mx.expand_dims(additive, -3)
            else:  # one mask per query head: split the head axis like the queries
                additive = additive.reshape(
                    *additive.shape[:-3], kv_heads, rep, *additive.shape[-2:]
                )
        scores = scores + additive
    row_max = mx.max(scores, axis=-1, keepdims=True)
    weights = _exp_shifted(scores, row_max)
    total = mx.sum(weights, axis=-1, keepdims=True)
    weights = weights.reshape(batch, kv_heads, rep * q_len, k_len)
    out = (weights @ values) / total.reshape(batch, kv_heads, rep * q_len, 1)
    return out.reshape(batch, heads, q_len, dim)


def _log_softmax_body(logits: mx.array, row_max: mx.array) -> mx.array:
    return mx.power(2.0, (logits - row_max) * LOG2E)


_exp_for_log_softmax = mx.compile(_log_softmax_body, shapeless=True)


def fast_log_softmax(logits: mx.array, axis: int = -1) -> mx.array:
    """``logits - logsumexp(logits, axis, keepdims=True)``, exponentiating as powers of two.

    Entries of -inf (masked tokens) come out as -inf, as with the reference; a row of
    all -inf gives NaN like the reference does.
    """
    row_max = mx.stop_gradient(mx.max(logits, axis=axis, keepdims=True))
    finite_max = mx.where(mx.isinf(row_max), 0.0, row_max).astype(logits.dtype)
    total = mx.sum(_exp_for_log_softmax(logits, finite_max), axis=axis, keepdims=True)
    return logits - (finite_max + mx.log(total))


# --- installing on a model -------------------------------------------------------------

_PATCHES: dict[tuple[str, str], Callable[..., mx.array]] = {
    ("swiglu", "reference"): REFERENCE_SWIGLU,
    ("swiglu", "fast"): fast_swiglu,
    ("scaled_dot_product_attention", "reference"): REFERENCE_SDPA,
    ("scaled_dot_product_attention", "fast"): fast_sdpa,
}
_installed: set[str] = set()
"""Names of the Python modules whose globals currently hold the fast forms."""
_install_lock = threading.Lock()


def _model_modules(model: Any) -> set[str]:
    names = {type(model).__module__}
    names.update(type(m).__module__ for m in model.modules())
    return {n for n in names if n.startswith("mlx_lm.models.")}


def _rebind(module_name: str, kind: str) -> bool:
    """Point the module's names at the ``kind`` forms; True when anything was rebound."""
    module = sys.modules.get(module_name)
    if module is None:
        return False
    other = "reference" if kind == "fast" else "fast"
    changed = False
    for name in ("swiglu", "scaled_dot_product_attention"):
        # Only a name that is mlx-lm's own function (or ours) is ours to rebind: a model
        # with its own attention or activation under the same name keeps it.
        if getattr(module, name, None) is _PATCHES[(name, other)]:
            setattr(module, name, _PATCHES[(name, kind)])
            changed = True
    return changed


def on_cpu() -> bool:
    """Whether MLX runs on the CPU (the forms are for that backend only)."""
    return bool(mx.default_device().type == mx.DeviceType.cpu)


def install_cpu_forms(model: Any) -> bool:
    """Give ``model``'s architecture the CPU forms when MLX runs on the CPU.

    Rebinds ``swiglu`` and ``scaled_dot_product_attention`` in the mlx-lm modules that
    define the model's classes, where those names are mlx-lm's own functions. Returns
    True when at least one module uses the fast forms afterwards (False on the GPU,
    or for an architecture that calls neither name).
    """
    if not on_cpu():
        return False
    load_kernels()  # the compiled kernels, when this machine can have them
    with _install_lock:
        for module_name in _model_modules(model):
            if _rebind(module_name, "fast") or module_name in _installed:
                _installed.add(module_name)
        return any(m in _installed for m in _model_modules(model))


def uninstall_cpu_forms() -> None:
    """Put mlx-lm's own functions back everywhere :func:`install_cpu_forms` changed them."""
    with _install_lock:
        for module_name in sorted(_installed):
            _rebind(module_name, "reference")
        _installed.clear()


@contextmanager
def reference_forms() -> Iterator[None]:
    """Run the block with mlx-lm's own functions, then restore the CPU forms that were installed.

    Not for use while another thread runs a model: the names are module globals.
    """
    with _install_lock:
        restored = sorted(_installed)
        for module_name in restored:
            _rebind(module_name, "reference")
        _installed.clear()
    try:
        yield
    finally:
        with _install_lock:
            for module_name in restored:
                _rebind(module_name, "fast")
                _installed.add(module_name)
