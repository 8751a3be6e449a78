"""The prompt cache's disk tier: KV states of cached prefixes kept in files, so a long
prompt's prefix outlives an eviction, an unload and a restart.

The in-memory prefix cache (`prefix.py`) hands states here when it evicts them and
when the engine closes (`PrefixCache.spill_all`); a lookup it cannot serve as well from
memory asks `load` for the longest prefix a file holds. Files live in one folder per
model identity (the folder and a hash of its config) and chat template, so several
models can share a directory; each is named by a hash of that identity, the tenant and
the token prefix, and carries them all in its metadata, with the tokens themselves.
Nothing in a file is trusted: one whose metadata, shapes or data CRC do not match what
its name and this model promise is removed and counted as `rejected`. A tenant's lookup
only ever considers files written for that tenant.

Writing runs on a worker thread fed by a bounded queue (an eviction whose spill would
wait on a full queue is dropped instead: the step loop never waits for the disk). The
worker never calls MLX: it writes NumPy views of the evaluated arrays, and hands each
state back for the model thread to release (`reap`). Reading runs on the model thread,
on the prefill path of the request that hits. Beyond `max_bytes` of files under the
directory, the least recently used (by modification time, renewed by a hit) are removed.
Folders are 0700 and files 0600 (`private.py`): a file holds its prompt's tokens.

Import this module only on the model thread, after `load_fast_blas()`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from mlxcel.metrics import PromptDiskStats
from mlxcel.model.cache import private, spill_file
from mlxcel.model.cache.layout import NAMES, Identity, Layout, kv_caches
from mlxcel.model.cache.spill_file import DTYPES, Tensor

log = logging.getLogger(__name__)

MIN_TOKENS = 32
"""A file is read only for a prefix at least this long, and longer than memory's."""
QUEUE_SIZE = 4
"""Spills waiting for the writer at most (each holds its KV state alive until written)."""
WAIT_SECS = 60.0
"""How long a spill that waits (at shutdown) waits for room in the queue at most."""
STALE_PART_SECS = 600
"""A temporary file older than this is a crashed writer's leftover, removed at start."""
SUFFIX = ".safetensors"


@dataclass(frozen=True, slots=True)
class _Entry:
    name: str
    tenant: str
    """The tenant's hash."""
    tokens: np.ndarray[Any, Any]
    size: int


@dataclass
class _Job:
    entry: _Entry
    tensors: list[Tensor]
    metadata: dict[str, str]
    owner: list[Any] = field(default_factory=list)
    """The MLX arrays the tensors view: released on the model thread only."""


class PromptDisk:
    """The prompt cache's disk tier: KV states of long prompts spilled to private files under
    a byte budget, so a restart or an eviction from memory does not cost a long prompt's
    reading again."""

    def __init__(self, root: Path, identity: Identity, layout: Layout, max_bytes: int) -> None:
        self.root = root
        self.folder = root / identity.key
        private.close_folder(root)  # 0700, and the files 0600: they hold prompts
        private.close_model_folder(self.folder)
        self.identity, self.layout, self.max_bytes = identity, layout, max_bytes
        self._index: dict[str, _Entry] = {}
        self._lock = threading.Lock()  # the index and the counters
        self._stats = PromptDiskStats()
        self._queue: queue.Queue[_Job | None] = queue.Queue(QUEUE_SIZE)
        self._done: deque[list[Any]] = deque()
        self._closed = False
        self._scan()
        self._writer = threading.Thread(target=self._write_loop, name="prompt-disk", daemon=True)
        self._writer.start()

    # --- the model thread -----------------------------------------------------------

    def spill(self, tokens: Sequence[int], cache: list[Any], tenant: str, *, wait: bool) -> bool:
        """Queue `cache`, the KV state of exactly `tokens`, to be written as the tenant's
        (`wait`: up to `WAIT_SECS` for room in the queue; else a full queue drops it);
        whether it was."""
        self.reap()
        if self._closed:
            return False
        array = np.asarray(tokens, dtype=np.int64)
        job = self._job(array, cache, tenant)
        if job is None:
            return False
        with self._lock:
            if job.entry.name in self._index:  # already on disk: it just stays longer
                self._touch(job.entry.name)
                return False
        try:
            self._queue.put(job, timeout=WAIT_SECS) if wait else self._queue.put_nowait(job)
        except queue.Full:
            self._count(dropped=1)
            return False
        return True

    def load(self, prompt: Sequence[int], tenant: str, better_than: int) -> tuple[list[Any], int]:
        """A KV state of the longest prefix of `prompt` (less than all of it) a file of the
        tenant's holds, if longer than `better_than` tokens, and its length; `([], 0)`."""
        self.reap()
        wanted = np.asarray(prompt, dtype=np.int64)
        owner = spill_file.digest(tenant)
        with self._lock:
            mine = [e for e in self._index.values() if e.tenant == owner]
        ranked = sorted(
            ((min(spill_file.common_length(e.tokens, wanted), len(wanted) - 1), e) for e in mine),
            key=lambda pair: -pair[0],
        )
        for usable, entry in ranked:
            if usable < MIN_TOKENS or usable <= better_than:
                break
            started = time.perf_counter()
            cache = self._read(entry)
            if cache is not None:
                for layer in cache:
                    layer.trim(layer.offset - usable)
                self._touch(entry.name)
                self._count(hits=1, read_bytes=entry.size)
                ms = (time.perf_counter() - started) * 1000
                log.info("prompt cache: %d tokens read from disk in %.0f ms", usable, ms)
                return cache, usable
        self._count(misses=1)
        return [], 0

    def flush(self) -> None:
        """Wait until every queued spill is written (or given up)."""
        self._queue.join()

    def reap(self) -> None:
        """Release the states the writer is done with (MLX frees them on this thread)."""
        while self._done:
            self._done.popleft()

    def close(self, timeout: float = 120.0) -> None:
        """Write what is queued (within `timeout` seconds) and stop the writer; later
        spills are not written."""
        self._closed = True
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            log.warning("prompt cache: the disk writer is stuck; pending spills are lost")
        self._writer.join(timeout)
        if self._writer.is_alive():
            log.warning("prompt cache: spills still being written after %g s", timeout)
        self.reap()

    def stats(self) -> PromptDiskStats:
        with self._lock:
            size = sum(e.size for e in self._index.values())
            return replace(self._stats, stored_bytes=size, files=len(self._index))

    def _job(self, tokens: np.ndarray[Any, Any], cache: list[Any], tenant: str) -> _Job | None:
        """The write of a state, or None for one this tier does not keep."""
        length = len(tokens)
        if not cache or not all(type(c) is KVCache and c.offset == length for c in cache):
            return None
        tenant_hash = spill_file.digest(tenant)
        tokens_hash = spill_file.tokens_digest(tokens)
        job = _Job(_Entry(self._name(tenant_hash, tokens_hash), tenant_hash, tokens, 0), [], {})
        for i, layer in enumerate(cache):
            for part, array in (("keys", layer.keys), ("values", layer.values)):
                name = NAMES.get(array.dtype)
                if name is None:
                    return None
                raw = array.view(mx.uint16) if array.dtype == mx.bfloat16 else array
                mx.eval(raw)
                job.owner.append(raw)
                view = np.asarray(memoryview(cast(Any, raw)))
                job.tensors.append(Tensor(f"{i}.{part}", view, DTYPES[name], length))
        size = sum(t.nbytes for t in job.tensors)
        if size > self.max_bytes:
            self._count(dropped=1)
            return None
        job.metadata = {
            "format": spill_file.FORMAT,
            "model": self.identity.model,
            "template": self.identity.template,
            "tenant": tenant_hash,
            "tokens": spill_file.tokens_text(tokens.tolist()),
            "tokens_sha256": tokens_hash,
            "layers": str(len(cache)),
        }
        return job

    def _name(self, tenant_hash: str, tokens_hash: str) -> str:
        key = spill_file.digest(self.identity.key, tenant_hash, tokens_hash)[:40]
        return key + SUFFIX

    def _read(self, entry: _Entry) -> list[Any] | None:
        """The file's KV state, whole; None (the file removed) when it is not to be trusted."""
        path = self.folder / entry.name
        try:
            arrays, meta = cast(
                tuple[dict[str, mx.array], dict[str, str]],
                mx.load(str(path), return_metadata=True),
            )
            if not np.array_equal(self._check(meta, entry.name), entry.tokens):
                raise ValueError("its tokens changed since it was indexed")
            cache = kv_caches(arrays, self.layout, len(entry.tokens), meta["crc32"])
        except FileNotFoundError:
            self._forget(entry.name)  # removed meanwhile (the budget, another server)
            return None
        except Exception as exc:  # whatever a damaged file makes the reader raise
            log.warning("prompt cache: removed %s: %s", entry.name, exc)
            self._remove(entry.name)
            self._count(rejected=1)
            return None
        return cache

    def _check(self, meta: dict[str, str], name: str) -> np.ndarray[Any, Any]:
        """A file's tokens, once its metadata is found to be this model's, this template's
        and what its name promises; ValueError otherwise."""
        expected = {
            "format": spill_file.FORMAT,
            "model": self.identity.model,
            "template": self.identity.template,
            "layers": str(self.layout.layers),
        }
        for key, value in expected.items():
            if meta.get(key) != value:
                raise ValueError(f"foreign file (its {key} is not this model's)")
        tokens = spill_file.tokens_of(meta["tokens"])
        tokens_hash = spill_file.tokens_digest(tokens)
        if meta.get("tokens_sha256") != tokens_hash:
            raise ValueError("its tokens do not match their hash")
        if self._name(meta.get("tenant", ""), tokens_hash) != name:
            raise ValueError("its name does not match its tenant and tokens")
        if len(tokens) < 1 or "crc32" not in meta:
            raise ValueError("it holds no tokens or no checksum")
        return tokens

    def _scan(self) -> None:
        """Index the folder's files (their headers only); remove what cannot be trusted."""
        for path in sorted(self.folder.iterdir()):
            name = path.name
            with contextlib.suppress(OSError):
                if name.endswith(".part") and time.time() - path.stat().st_mtime > STALE_PART_SECS:
                    path.unlink()
            if not name.endswith(SUFFIX):
                continue
            try:
                meta = spill_file.read_metadata(path)
                tokens = self._check(meta, name)
                entry = _Entry(name, meta["tenant"], tokens, path.stat().st_size)
            except (OSError, ValueError, KeyError) as exc:
                log.warning("prompt cache: removed %s: %s", name, exc)
                with contextlib.suppress(OSError):
                    path.unlink(missing_ok=True)
                self._count(rejected=1)
                continue
            self._index[name] = entry
        if self._index:
            log.info("prompt cache: %d files on disk in %s", len(self._index), self.folder)

    def _touch(self, name: str) -> None:
        with contextlib.suppress(OSError):  # never creates it: removed meanwhile, it stays so
            os.utime(self.folder / name)

    def _count(self, **counts: int) -> None:
        with self._lock:
            now = self._stats
            self._stats = replace(now, **{k: getattr(now, k) + n for k, n in counts.items()})

    def _forget(self, name: str) -> None:
        with self._lock:
            self._index.pop(name, None)

    def _remove(self, name: str) -> None:
        self._forget(name)
        with contextlib.suppress(OSError):
            (self.folder / name).unlink()

    # --- the writer thread ----------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                self._write(job)
            except Exception:  # the disk tier never takes the server down
                log.exception("prompt cache: could not write %s", job.entry.name)
                self._count(dropped=1)
            finally:
                owner, job.tensors, job.owner = job.owner, [], []
                self._done.append(owner)  # released on the model thread
                self._queue.task_done()

    def _write(self, job: _Job) -> None:
        path = self.folder / job.entry.name
        try:
            size = spill_file.write_atomic(path, job.tensors, job.metadata)
        except OSError as exc:
            log.warning("prompt cache: could not write %s: %s", job.entry.name, exc)
            self._count(dropped=1)
            return
        entry = replace(job.entry, size=size)
        with self._lock:
            self._index[entry.name] = entry
            covered = [
                e.name
                for e in self._index.values()
                if e.tenant == entry.tenant
                and len(e.tokens) < len(entry.tokens)
                and np.array_equal(e.tokens, entry.tokens[: len(e.tokens)])
            ]
        for name in covered:  # a longer state serves every prefix of it
            self._remove(name)
        self._count(spills=1, written_bytes=size)
        self._fit()

    def _fit(self) -> None:
        """Remove the least recently used files under the directory beyond the budget."""
        files = []
        for path in self.root.glob(f"*/*{SUFFIX}"):
            with contextlib.suppress(OSError):
                st = path.stat()
                files.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.max_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size
            if path.parent == self.folder:
                self._forget(path.name)
