"""Re-pack llama.cpp's quantised blocks into MLX's affine layout, keeping their precision.

MLX's affine quantisation (``mx.quantize(..., mode="affine")``) stores each
row in groups of ``group_size`` consecutive weights: ``bits``-bit unsigned
integers ``q`` and, per group, a scale and a bias, so ``w = q * scale + bias``.
llama.cpp's block formats are the same idea with other field layouts:

- Q8_0, Q5_0, Q4_0: ``d * (q - offset)`` over blocks of 32 (scale ``d``,
  bias ``-offset * d``); Q5_1 and Q4_1 add a minimum ``m`` (the bias).
- Q4_K, Q5_K: super-blocks of 256 whose eight 32-value sub-blocks have 6-bit
  scales and minima: scale ``d * sc``, bias ``-dmin * m`` per sub-block.

All of these land on 32-value groups exactly: the products are exact in the
float32 scales and biases, and MLX's ``q * scale + bias`` rounds once, as
llama.cpp's reference dequantisation does. Q6_K has 16-value sub-blocks with
their own scales, which no MLX group size fits (32 is the smallest), so each
32-value group is re-quantised to 8 bits from its dequantised values: the
error is at most half an 8-bit step of the group, about an eighth of the
coarser sub-block's own Q6_K step. Other types are not re-packed here (the
caller keeps them as float).

The integers are packed as ``mx.quantize`` packs them: a little-endian bit
stream per row (value ``i`` at bits ``i * bits ...``), read as ``uint32``, so
a row of ``K`` weights becomes ``K * bits / 32`` words.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from gguf import GGML_QUANT_SIZES, ReaderTensor
from gguf import GGMLQuantizationType as Q
from gguf.quants import Q4_K, dequantize

Array = npt.NDArray[Any]
#: ``(q, scales, biases)`` of a run of whole blocks: ``q`` as uint8 per weight,
#: scales and biases as float32 per 32-value group.
Groups = tuple[Array, Array, Array]

#: ``(name, GGUF type, largest error, largest weight)`` of each re-quantised tensor.
Report = list[tuple[str, str, float, float]]

GROUP_SIZE = 32
#: Values decoded per step: bounds the temporaries (uint64 packing words)
#: to a few tens of MB even for the 136M-weight embedding.
_CHUNK_VALUES = 1 << 22


def _f16(raw: Array) -> Array:
    """``(n, 2)`` bytes holding float16 -> ``(n, 1)`` float32."""
    return np.ascontiguousarray(raw).view("<f2").astype(np.float32)


def _nibbles(qs: Array) -> Array:
    """The 32 values of a Q4_0/Q4_1/Q5 block: low nibbles first, then high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: Array) -> Array:
    """Q5_0/Q5_1: bit ``i`` of the little-endian 32-bit ``qh`` is value ``i``'s fifth bit."""
    return np.unpackbits(np.ascontiguousarray(qh), axis=-1, bitorder="little")


def _q8_0(b: Array) -> Groups:
    d = _f16(b[:, 0:2])
    # int8 two's complement + 128 as uint8 is the sign bit flipped.
    return b[:, 2:34] ^ np.uint8(0x80), d, -128.0 * d


def _q4_0(b: Array) -> Groups:
    d = _f16(b[:, 0:2])
    return _nibbles(b[:, 2:18]), d, -8.0 * d


def _q4_1(b: Array) -> Groups:
    return _nibbles(b[:, 4:20]), _f16(b[:, 0:2]), _f16(b[:, 2:4])


def _q5_0(b: Array) -> Groups:
    d = _f16(b[:, 0:2])
    return _nibbles(b[:, 6:22]) | (_high_bits(b[:, 2:6]) << 4), d, -16.0 * d


def _q5_1(b: Array) -> Groups:
    q = _nibbles(b[:, 8:24]) | (_high_bits(b[:, 4:8]) << 4)
    return q, _f16(b[:, 0:2]), _f16(b[:, 2:4])


def _q4_k(b: Array) -> Groups:
    """Q4_K (and Q5_K's low bits): per 32-value sub-block a scale, a bias and nibbles."""
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, m = Q4_K.get_scale_min(np.ascontiguousarray(b[:, 4:16]))
    scales = d * sc.astype(np.float32)
    biases = -(dmin * m.astype(np.float32))
    qs = b[:, -128:].reshape(n, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (qs & 0x0F).reshape(n, 256), scales, biases


def _q5_k(b: Array) -> Groups:
    n = b.shape[0]
    low, scales, biases = _q4_k(b)
    # Sub-block j takes bit j of each of the 32 qh bytes as its fifth bit.
    qh = b[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    return low | ((qh & 1).reshape(n, 256) << 4), scales, biases


def requantize8(values: Array) -> Groups:
    """8-bit affine groups of 32 (min/max grid) for float ``values`` of shape ``(n, 32*k)``.

    ``q`` is rounded against the float32 scale and bias actually stored, so
    the error is at most half the group's step plus float32 rounding.
    """
    n = values.shape[0]
    v = values.astype(np.float64).reshape(n, -1, GROUP_SIZE)
    low, high = v.min(axis=-1), v.max(axis=-1)
    scales = ((high - low) / 255.0).astype(np.float32)
    biases = low.astype(np.float32)
    step = np.where(scales == 0, 1.0, scales.astype(np.float64))[..., None]
    q = np.rint((v - biases.astype(np.float64)[..., None]) / step)
    return np.clip(q, 0, 255).astype(np.uint8).reshape(n, -1), scales, biases


def _q6_k(b: Array) -> Groups:
    return requantize8(dequantize(b, Q.Q6_K))


#: GGUF type -> (MLX bits, block decoder).
_DECODERS: dict[Q, tuple[int, Callable[[Array], Groups]]] = {
    Q.Q8_0: (8, _q8_0),
    Q.Q5_0: (5, _q5_0),
    Q.Q5_1: (5, _q5_1),
    Q.Q4_0: (4, _q4_0),
    Q.Q4_1: (4, _q4_1),
    Q.Q4_K: (4, _q4_k),
    Q.Q5_K: (5, _q5_k),
    Q.Q6_K: (8, _q6_k),
}
#: Types whose re-packing is exact; the others are re-quantised.
EXACT = frozenset({Q.Q8_0, Q.Q5_0, Q.Q5_1, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q5_K})


def mlx_bits(qtype: Q) -> int | None:
    """The MLX affine bits ``qtype`` is re-packed to, or None when it is kept as float."""
    entry = _DECODERS.get(qtype)
    return entry[0] if entry is not None else None


def pack(q: Array, bits: int) -> Array:
    """MLX's packing of unsigned ``bits``-bit integers ``q`` (rows, K) -> uint32 (rows, K*bits/32)."""
    rows, cols = q.shape
    if cols * bits % 32:
        raise ValueError(f"a row of {cols} {bits}-bit values does not fill whole uint32 words")
    if bits == 8:
        return np.ascontiguousarray(q, dtype=np.uint8).view("<u4")
    # Eight values fill exactly ``bits`` bytes: build them in a uint64, keep its low bytes.
    eights = q.reshape(rows, cols // 8, 8)
    words = np.zeros((rows, cols // 8), dtype="<u8")
    for j in range(8):
        words |= eights[..., j].astype("<u8") << np.uint64(bits * j)
    packed = np.ascontiguousarray(words.view(np.uint8).reshape(rows, cols // 8, 8)[..., :bits])
    return packed.reshape(rows, cols * bits // 8).view("<u4")


def repack(data: Array, qtype: Q, shape: tuple[int, int]) -> tuple[Array, Array, Array, int]:
    """``(weight, scales, biases, bits)`` in MLX's affine layout for a GGUF tensor.

    ``data`` is the tensor's raw blocks as ``GGUFReader`` gives them (uint8,
    one row of blocks per weight row) and ``shape`` its ``(rows, columns)``.
    Rows are decoded a chunk at a time, so the temporaries stay small.
    """
    if qtype not in _DECODERS:
        raise ValueError(f"no MLX re-packing for GGUF type {qtype.name}")
    bits, decode = _DECODERS[qtype]
    rows, cols = shape
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    if cols % block_elems:
        raise ValueError(f"{cols} columns are not whole {qtype.name} blocks")
    blocks = np.asarray(data, dtype=np.uint8).reshape(rows, (cols // block_elems) * block_bytes)
    weight = np.empty((rows, cols * bits // 32), dtype=np.uint32)
    scales = np.empty((rows, cols // GROUP_SIZE), dtype=np.float32)
    biases = np.empty_like(scales)
    step = max(1, _CHUNK_VALUES // cols)
    for start in range(0, rows, step):
        end = min(rows, start + step)
        q, s, b = decode(blocks[start:end].reshape(-1, block_bytes))
        weight[start:end] = pack(q.reshape(end - start, cols), bits)
        scales[start:end] = s.reshape(end - start, -1)
        biases[start:end] = b.reshape(end - start, -1)
    return weight, scales, biases, bits


def dequantize_groups(weight: Array, scales: Array, biases: Array, bits: int) -> Array:
    """Float32 values of MLX affine groups, in numpy (for error reports, not for serving)."""
    rows = weight.shape[0]
    raw = np.ascontiguousarray(weight).view(np.uint8)
    if bits == 8:
        q = raw
    else:
        stream = np.unpackbits(raw, axis=-1, bitorder="little").reshape(rows, -1, bits)
        q = (stream.astype(np.uint32) << np.arange(bits, dtype=np.uint32)).sum(axis=-1)
    grouped = q.reshape(rows, -1, GROUP_SIZE).astype(np.float32)
    return (grouped * scales[..., None] + biases[..., None]).reshape(rows, -1)


def quantization_config(bits: dict[str, int]) -> dict[str, Any]:
    """mlx-lm's ``quantization`` block: the most common bits, then per-module exceptions."""
    default = Counter(bits.values()).most_common(1)[0][0]
    block: dict[str, Any] = {"group_size": GROUP_SIZE, "bits": default, "mode": "affine"}
    for module, width in bits.items():
        if width != default:
            block[module] = {"group_size": GROUP_SIZE, "bits": width, "mode": "affine"}
    return block


def quantized_producer(
    name: str, tensor: ReaderTensor, transform: Callable[[Array], Array] | None, report: Report
) -> Callable[[], list[Array]]:
    """Re-pack ``tensor``; a row transform (llama's Q/K order) moves weight, scales and biases alike."""

    def produce() -> list[Array]:
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        weight, scales, biases, bits = repack(tensor.data, tensor.tensor_type, (shape[0], shape[1]))
        if tensor.tensor_type not in EXACT:
            want = dequantize(tensor.data, tensor.tensor_type).reshape(shape)
            got = dequantize_groups(weight, scales, biases, bits)
            error = float(np.abs(got - want).max())
            report.append((name, tensor.tensor_type.name, error, float(np.abs(want).max())))
        parts = [weight, scales, biases]
        return parts if transform is None else [transform(p) for p in parts]

    return produce
