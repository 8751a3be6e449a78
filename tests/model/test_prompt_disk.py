"""The prompt cache's disk tier on synthetic KV states: files read back bit for bit, and
nothing damaged, foreign or another tenant's is ever served."""

from __future__ import annotations

import json
import os
import stat
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mlxcel.model.native.blas import load_fast_blas

load_fast_blas()  # before mlx.core

import mlx.core as mx  # noqa: E402
from mlx_lm.models.cache import KVCache  # noqa: E402

from mlxcel.model.cache import disk as prompt_disk  # noqa: E402
from mlxcel.model.cache import spill_file  # noqa: E402
from mlxcel.model.cache.disk import PromptDisk  # noqa: E402
from mlxcel.model.cache.layout import Identity, Layout  # noqa: E402

pytestmark = pytest.mark.mlx

IDENTITY = Identity("/models/a#config-1", "template-1")
LAYOUT = Layout(layers=3, heads=2, dim=8, value_dim=4, dtype="bfloat16")
TOKENS = list(range(1000, 1200))


def kv(length: int, layout: Layout = LAYOUT, seed: int = 0) -> list[Any]:
    """A KV state of `length` tokens, written the way the engine writes one (into a
    buffer longer than its tokens)."""
    mx.random.seed(seed)
    dtype = getattr(mx, layout.dtype)
    cache = []
    for _ in range(layout.layers):
        layer = KVCache()
        k = mx.random.normal((1, layout.heads, length, layout.dim)).astype(dtype)
        v = mx.random.normal((1, layout.heads, length, layout.value_dim)).astype(dtype)
        layer.update_and_fetch(k, v)
        mx.eval(layer.keys, layer.values)
        cache.append(layer)
    return cache


def bits(a: mx.array) -> np.ndarray[Any, Any]:
    raw = a.view(mx.uint16) if a.dtype == mx.bfloat16 else a
    return np.array(raw)


def same_state(got: list[Any], want: list[Any], length: int) -> bool:
    return all(
        np.array_equal(bits(g.keys[..., :length, :]), bits(w.keys[..., :length, :]))
        and np.array_equal(bits(g.values[..., :length, :]), bits(w.values[..., :length, :]))
        for g, w in zip(got, want, strict=True)
    )


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "prompt-cache"


@pytest.fixture
def disks(root: Path) -> Iterator[list[PromptDisk]]:
    """Every tier a test opens, closed at its end."""
    opened: list[PromptDisk] = []
    yield opened
    for disk in opened:
        disk.close()


def open_disk(disks: list[PromptDisk], root: Path, **kw: Any) -> PromptDisk:
    disk = PromptDisk(
        root, kw.get("identity", IDENTITY), kw.get("layout", LAYOUT), kw.get("budget", 1 << 30)
    )
    disks.append(disk)
    return disk


def written(disks: list[PromptDisk], root: Path, tokens: list[int], tenant: str = "") -> Path:
    """Spill a state of `tokens` and wait for its file; the file."""
    disk = open_disk(disks, root)
    assert disk.spill(tokens, kv(len(tokens)), tenant, wait=True)
    disk.close()
    (path,) = disk.folder.glob("*.safetensors")
    return path


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_a_state_comes_back_bit_for_bit_after_a_restart(
    disks: list[PromptDisk], root: Path, dtype: str
) -> None:
    layout = Layout(3, 2, 8, 4, dtype)
    state = kv(len(TOKENS), layout)
    first = open_disk(disks, root, layout=layout)
    assert first.spill(TOKENS, state, "t", wait=True)
    first.close()
    again = open_disk(disks, root, layout=layout)  # a new process would index it the same
    cache, cached = again.load([*TOKENS, 7, 8], "t", better_than=0)
    assert cached == len(TOKENS)
    assert same_state(cache, state, len(TOKENS))
    cache, cached = again.load([*TOKENS[:150], 1, 2, 3], "t", better_than=0)
    assert cached == 150
    assert [layer.offset for layer in cache] == [150] * 3
    assert same_state(cache, state, 150)
    _exact, cached = again.load(TOKENS, "t", better_than=0)
    assert cached == len(TOKENS) - 1  # the last token is always read again
    stats = again.stats()
    assert (stats.hits, stats.files, stats.rejected) == (3, 1, 0)


def test_memory_is_preferred_when_it_holds_as_much(disks: list[PromptDisk], root: Path) -> None:
    written(disks, root, TOKENS)
    disk = open_disk(disks, root)
    assert disk.load([*TOKENS, 1], "", better_than=len(TOKENS))[1] == 0
    assert disk.load([*TOKENS[:20], 1], "", better_than=0)[1] == 0  # too short to read a file
    assert disk.stats().misses == 2


def test_files_are_written_whole_or_not_at_all(
    disks: list[PromptDisk], root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = open_disk(disks, root)

    def refuse(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spill_file.os, "replace", refuse)
    assert disk.spill(TOKENS, kv(len(TOKENS)), "", wait=True)
    disk.close()
    assert list(disk.folder.iterdir()) == []  # neither the file nor its temporary
    assert disk.stats().dropped == 1
    assert disk.stats().spills == 0


def test_a_crashed_writers_leftover_is_removed_at_start(
    disks: list[PromptDisk], root: Path
) -> None:
    folder = open_disk(disks, root).folder
    stale, fresh = folder / ".x.safetensors.1.part", folder / ".y.safetensors.2.part"
    stale.write_bytes(b"half a file")
    fresh.write_bytes(b"another server writing now")
    old = time.time() - prompt_disk.STALE_PART_SECS - 60
    os.utime(stale, (old, old))
    open_disk(disks, root)
    assert not stale.exists()
    assert fresh.exists()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """The process umask for the test (0o022 unless parametrized), restored after."""
    value = getattr(request, "param", 0o022)
    old = os.umask(value)
    yield value
    os.umask(old)


@pytest.mark.parametrize("umask", [0o022, 0o000, 0o277], indirect=True)
def test_files_are_0600_and_folders_0700_whatever_the_umask(
    disks: list[PromptDisk], root: Path, monkeypatch: pytest.MonkeyPatch, umask: int
) -> None:
    """Each file holds a prompt's token ids in the clear: no other user may read one,
    nor list the folders; the temporary file is never wider before its rename."""
    before_rename: list[int] = []
    rename = os.replace

    def seen(src: Path, dst: Path) -> None:
        before_rename.append(mode(Path(src)))
        rename(src, dst)

    monkeypatch.setattr(spill_file.os, "replace", seen)
    path = written(disks, root, TOKENS)
    assert before_rename == [0o600]
    assert (mode(path), mode(path.parent), mode(root)) == (0o600, 0o700, 0o700)


def test_an_open_tier_an_earlier_release_left_is_closed_at_start(
    disks: list[PromptDisk], root: Path, umask: int
) -> None:
    path = written(disks, root, TOKENS)
    writing = path.with_name(".y.safetensors.1.part")  # another server's, being written
    writing.write_bytes(b"half a file")
    for opened, wide in ((root, 0o755), (path.parent, 0o755), (path, 0o644), (writing, 0o644)):
        os.chmod(opened, wide)
    disk = open_disk(disks, root)
    assert [mode(p) for p in (root, path.parent, path, writing)] == [0o700, 0o700, 0o600, 0o600]
    assert disk.load([*TOKENS, 1], "", better_than=0)[1] == len(TOKENS)  # still served


def test_a_truncated_file_is_removed_at_start(disks: list[PromptDisk], root: Path) -> None:
    path = written(disks, root, TOKENS)
    path.write_bytes(path.read_bytes()[:-100])
    disk = open_disk(disks, root)
    assert not path.exists()
    assert disk.stats().rejected == 1
    assert disk.load([*TOKENS, 1], "", better_than=0)[1] == 0


def test_a_file_truncated_while_indexed_is_removed_when_read(
    disks: list[PromptDisk], root: Path
) -> None:
    path = written(disks, root, TOKENS)
    disk = open_disk(disks, root)
    path.write_bytes(path.read_bytes()[:-100])
    assert disk.load([*TOKENS, 1], "", better_than=0)[1] == 0
    assert not path.exists()
    assert disk.stats().rejected == 1


def rewrite_header(path: Path, change: Any) -> None:
    """Rewrite a file's header through `change(header)`, keeping its data."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    change(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length :])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tokens", spill_file.tokens_text([*TOKENS[:-1], 5])),  # other tokens, same hash
        ("tokens_sha256", "0" * 64),
        ("model", "/models/b#config-9"),  # a foreign model's file under this one's name
        ("template", "another-template"),
        ("tenant", spill_file.digest("someone else")),
        ("format", "something-else/9"),
        ("layers", "4"),
    ],
)
def test_tampered_metadata_is_never_trusted(
    disks: list[PromptDisk], root: Path, field: str, value: str
) -> None:
    path = written(disks, root, TOKENS)
    rewrite_header(path, lambda h: h["__metadata__"].__setitem__(field, value))
    disk = open_disk(disks, root)
    assert not path.exists()
    assert disk.load([*TOKENS, 1], "", better_than=0)[1] == 0


def test_tampered_data_is_found_by_its_checksum(disks: list[PromptDisk], root: Path) -> None:
    path = written(disks, root, TOKENS)
    raw = bytearray(path.read_bytes())
    raw[-10] ^= 0x40
    path.write_bytes(bytes(raw))
    disk = open_disk(disks, root)  # the header is intact: it is indexed
    assert disk.load([*TOKENS, 1], "", better_than=0)[1] == 0
    assert not path.exists()
    assert disk.stats().rejected == 1


def test_a_state_of_another_shape_is_never_loaded(disks: list[PromptDisk], root: Path) -> None:
    other = Layout(3, 2, 8, 8, "bfloat16")  # same identity, values 8 wide: a tampered file
    first = open_disk(disks, root, layout=other)
    first.spill(TOKENS, kv(len(TOKENS), other), "", wait=True)
    first.close()
    disk = open_disk(disks, root)
    assert disk.load([*TOKENS, 1], "", better_than=0)[1] == 0
    assert disk.stats().rejected == 1
    assert list(disk.folder.iterdir()) == []


def test_another_models_files_are_neither_seen_nor_touched(
    disks: list[PromptDisk], root: Path
) -> None:
    path = written(disks, root, TOKENS)
    other = open_disk(disks, root, identity=Identity("/models/b#config-2", "template-1"))
    assert other.folder != path.parent
    assert other.load([*TOKENS, 1], "", better_than=0)[1] == 0
    copied = other.folder / path.name  # a file moved into another model's folder
    copied.write_bytes(path.read_bytes())
    open_disk(disks, root, identity=other.identity)
    assert path.exists()
    assert not copied.exists()


def test_another_tenants_prefix_is_never_served(disks: list[PromptDisk], root: Path) -> None:
    written(disks, root, TOKENS, tenant="alice")
    disk = open_disk(disks, root)
    assert disk.load([*TOKENS, 1], "bob", better_than=0)[1] == 0
    assert disk.load([*TOKENS, 1], "", better_than=0)[1] == 0
    assert disk.load([*TOKENS, 1], "alice", better_than=0)[1] == len(TOKENS)


def test_the_budget_removes_the_least_recently_used(disks: list[PromptDisk], root: Path) -> None:
    probe = written(disks, root, TOKENS)
    size = probe.stat().st_size
    probe.unlink()
    disk = open_disk(disks, root, budget=2 * size + size // 2)
    prompts = [[n, *TOKENS[1:]] for n in (1, 2, 3)]
    for n, tokens in enumerate(prompts[:2]):
        disk.spill(tokens, kv(len(tokens), seed=n), "", wait=True)
        time.sleep(0.05)  # modification times a clock tick apart
    disk.close()
    disk = open_disk(disks, root, budget=2 * size + size // 2)
    assert disk.load([*prompts[0], 9], "", better_than=0)[1] > 0  # used again: the newest
    time.sleep(0.05)
    disk.spill(prompts[2], kv(len(TOKENS), seed=3), "", wait=True)
    disk.close()
    again = open_disk(disks, root, budget=2 * size + size // 2)
    served = [again.load([*p, 9], "", better_than=0)[1] > 0 for p in prompts]
    assert served == [True, False, True]
    assert again.stats().stored_bytes <= 2 * size + size // 2


def test_a_state_larger_than_the_budget_is_not_written(disks: list[PromptDisk], root: Path) -> None:
    disk = open_disk(disks, root, budget=1000)
    assert not disk.spill(TOKENS, kv(len(TOKENS)), "", wait=True)
    disk.close()
    assert list(disk.folder.iterdir()) == []
    assert disk.stats().dropped == 1


def test_a_longer_state_replaces_its_prefixes(disks: list[PromptDisk], root: Path) -> None:
    disk = open_disk(disks, root)
    disk.spill(TOKENS[:100], kv(100), "", wait=True)
    disk.spill(TOKENS[:100], kv(100), "other", wait=True)
    disk.spill(TOKENS, kv(len(TOKENS)), "", wait=True)
    disk.close()
    assert disk.stats().files == 2  # the tenant's long one, and the other tenant's


def test_a_full_queue_drops_evictions_instead_of_waiting(
    disks: list[PromptDisk], root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    real = spill_file.write_atomic

    def slow(*args: Any) -> int:
        gate.wait(10)
        return real(*args)

    monkeypatch.setattr(spill_file, "write_atomic", slow)
    disk = open_disk(disks, root)
    results = [
        disk.spill([n, *TOKENS], kv(len(TOKENS) + 1), "", wait=False)
        for n in range(prompt_disk.QUEUE_SIZE + 3)
    ]
    gate.set()
    disk.close()
    assert not all(results)
    assert results[: prompt_disk.QUEUE_SIZE] == [True] * 4
    assert disk.stats().dropped == results.count(False)
    assert disk.stats().spills == results.count(True)


def test_a_folder_where_a_file_should_be_is_left_alone(disks: list[PromptDisk], root: Path) -> None:
    folder = open_disk(disks, root).folder
    (folder / "odd.safetensors").mkdir()
    disk = open_disk(disks, root)
    assert disk.stats().files == 0
    assert disk.stats().rejected == 1
    assert disk.spill(TOKENS, kv(len(TOKENS)), "", wait=True)
