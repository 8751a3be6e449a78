"""One prompt-cache file: a safetensors file of a prefix's KV state, with its metadata.

The disk tier (`disk.py`) writes these on a worker thread, which must not call MLX
(the model thread is MLX's only user), so the file is written here from NumPy views of
the already-evaluated arrays: safetensors is an 8-byte header length, a JSON header
(each tensor's dtype, shape and byte range, and a `__metadata__` map of strings) and the
tensors' bytes, which `mx.load` reads back. A file is written atomically: to a temporary
name in the same folder (0600 from its creation), flushed and fsynced, then renamed over
its final name and the folder fsynced, so a reader sees the whole file or none. The metadata carries a CRC-32 of
the tensor bytes, so a damaged file is found out when read.

Imports nothing of MLX.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mlxcel.model.cache.private import create_private

FORMAT = "mlxcel-prompt-cache/1"
"""The `format` metadata value of every file this module writes."""

MAX_HEADER = 64 * 1024 * 1024
"""A header longer than this is no header of ours (a damaged length)."""

DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
"""The KV dtypes a file may hold, by MLX name, with their safetensors names."""
_SIZES = {"F32": 4, "F16": 2, "BF16": 2}


@dataclass(frozen=True, slots=True)
class Tensor:
    """One tensor to write: `data` a NumPy view of its bytes (any strides; bfloat16 as
    uint16), `dtype` its safetensors name, its first `length` positions along axis 2."""

    name: str
    data: np.ndarray[Any, Any]
    dtype: str
    length: int

    @property
    def nbytes(self) -> int:
        shape = self.data.shape
        return int(self.data.itemsize * shape[0] * shape[1] * self.length * shape[3])

    def rows(self) -> np.ndarray[Any, Any]:
        """The bytes to write, C-contiguous (a copy when the view is a longer buffer's)."""
        return np.ascontiguousarray(self.data[:, :, : self.length])


def tokens_text(tokens: Sequence[int]) -> str:
    """Token ids as metadata text: little-endian int32, base64."""
    return base64.b64encode(np.asarray(tokens, dtype="<i4").tobytes()).decode("ascii")


def tokens_of(text: str) -> np.ndarray[Any, Any]:
    """The token ids `tokens_text` wrote (ValueError for text that is not such)."""
    raw = base64.b64decode(text.encode("ascii"), validate=True)
    if len(raw) % 4:
        raise ValueError("token bytes are not whole int32s")
    return np.frombuffer(raw, dtype="<i4").astype(np.int64)


def common_length(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> int:
    """How many leading tokens two token arrays share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def digest(*parts: str) -> str:
    """A SHA-256 hex digest of the parts, each ended by a NUL (so no two lists collide)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8") + b"\0")
    return h.hexdigest()


def tokens_digest(tokens: np.ndarray[Any, Any]) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()


def write_atomic(path: Path, tensors: Sequence[Tensor], metadata: dict[str, str]) -> int:
    """Write the tensors and `metadata` (plus the data's `crc32`) to `path` atomically;
    the file's size. OSError when the disk refuses (nothing is left behind)."""
    crc, header = 0, {}
    offset = 0
    chunks = []
    for t in tensors:
        rows = t.rows()
        crc = zlib.crc32(_bytes_of(rows), crc)
        header[t.name] = {
            "dtype": t.dtype,
            "shape": list(rows.shape),
            "data_offsets": [offset, offset + rows.nbytes],
        }
        offset += rows.nbytes
        chunks.append(rows)
    header["__metadata__"] = {**metadata, "crc32": str(crc)}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the tensors start 8-byte aligned
    temp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.part")
    try:
        fd = create_private(temp)  # 0600 from the start: the tokens are in the header
        with os.fdopen(fd, "wb") as out:
            out.write(struct.pack("<Q", len(text)))
            out.write(text)
            for rows in chunks:
                out.write(_bytes_of(rows))
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return 8 + len(text) + offset


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_metadata(path: Path) -> dict[str, str]:
    """The `__metadata__` of a file's header, read without its tensors; ValueError (or
    OSError) for a file that is not a whole safetensors header."""
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError("no header length")
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER:
            raise ValueError("header length out of range")
        text = f.read(length)
    if len(text) != length:
        raise ValueError("truncated header")
    header = json.loads(text)
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
    ):
        raise ValueError("no metadata")
    if header_bytes(header) + 8 + length != path.stat().st_size:
        raise ValueError("file size does not match its header")
    return meta


def header_bytes(header: dict[str, Any]) -> int:
    """The tensor bytes a header declares (ValueError for a malformed one)."""
    total = 0
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        start, end = spec["data_offsets"]
        size = _SIZES.get(spec["dtype"])
        if size is None or end - start != size * int(np.prod(spec["shape"])):
            raise ValueError(f"tensor {name} is malformed")
        total = max(total, end)
    return total


def data_crc(arrays: Sequence[np.ndarray[Any, Any]]) -> str:
    """The CRC-32 `write_atomic` records, of arrays read back (C-contiguous, in order)."""
    crc = 0
    for a in arrays:
        crc = zlib.crc32(_bytes_of(np.ascontiguousarray(a)), crc)
    return str(crc)


def _bytes_of(array: np.ndarray[Any, Any]) -> memoryview:
    """A C-contiguous array's bytes, without a copy."""
    return array.reshape(-1).view(np.uint8).data
