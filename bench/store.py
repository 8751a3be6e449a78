"""Store benchmark: the memory and SQLite backends side by side, through the store handle.

What it measures, on `--store memory` and on `--store sqlite` (a file in a temporary
directory, removed after), with limits so large that nothing is evicted or expires:

1. put+get: `StoreHandle.put` then `StoreHandle.get` of a realistic response (a user
   turn, a tool call and its output as input items; a reasoning item and a Message with
   `--output-bytes` of text as output), each with fresh ids, from `--tasks` Trio tasks at
   once, `--ops` pairs each, on a store already holding `--stored` responses. The
   latency of the pair (p50, p99, max) and the pairs per second of all tasks together.
   Targets: p50 <= 2 ms, p99 <= 20 ms. A pair's latency at 8 tasks includes its wait
   behind the others' (the SQLite backend runs one operation at a time, the memory one
   runs on Trio's thread), so the same run with one task follows: the pair's own cost.
2. start-up: from `StoreActor(...).run` starting to its handle being ready, on a new
   file, on an empty file and on a file holding `--stored` responses (filled, closed,
   then opened `--repeats` times; the median). Target: the stored responses add <= 1 s.
   Then a whole server (on the fake engine, as `bench/machinery.py` starts it) from its
   process starting to `/health` answering 200, with `--store sqlite:PATH` on the empty
   file and on the filled one (median of `--server-repeats`); memory for reference.
3. a chain: `--hops` responses linked by `previous_response_id`, stored among the
   others; `StoreHandle.get_chain` of the last, `--chain-repeats` times (p50, p99).
   Target: <= 50 ms.

The SQLite file stays in the OS page cache between its close and the re-open, so the
start-up figure is a warm start (a cold one also reads the file from disk).

Run from the repository root (the machine should be idle):

    .venv/bin/python bench/store.py                      # ~10 s of put+get per backend
    .venv/bin/python bench/store.py --ops 200 --stored 2000 --server-repeats 1  # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import trio
from machinery import server

from mlxcel.items import (
    FunctionCall,
    FunctionCallOutput,
    InputText,
    Message,
    OutputText,
    Reasoning,
    RequestEcho,
    ResponseRecord,
    Usage,
    new_id,
)
from mlxcel.store import StoreActor, StoreHandle, StoreLimits
from mlxcel.store.codec import encoded_size

UNBOUNDED = StoreLimits(10_000_000, 1 << 42, 0)
"""No entry cap, budget or TTL that this benchmark could reach: nothing is evicted."""
EPHEMERAL_TTL_SECS = 600.0
VOCABULARY = (
    "the store keeps each response so a later turn can continue it by id and a client "
    "can poll a background job def return import class self value none true false for "
    "in if else while try except with as yield await async lambda print len range dict"
)
WORDS = tuple(VOCABULARY.split())


def prose(length: int, seed: int) -> str:
    """About `length` characters of word salad (JSON-encodes to its own length)."""
    rng = random.Random(seed)
    words: list[str] = []
    size = 0
    while size < length:
        word = rng.choice(WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:length]


def response(output_text: str, previous: str | None = None) -> ResponseRecord:
    """A completed response of one agent turn, with fresh ids."""
    call_id = new_id("call")
    return ResponseRecord(
        id=new_id("resp"),
        created_at=int(time.time()),
        status="completed",
        echo=RequestEcho(model="bench", previous_response_id=previous),
        input_items=(
            Message("user", (InputText(output_text[:600]),), id=new_id("msg")),
            FunctionCall(call_id, "shell", '{"cmd": ["ls", "-la"]}', id=new_id("fc")),
            FunctionCallOutput(call_id, output_text[:2000], id=new_id("fco")),
        ),
        output=(
            Reasoning(output_text[:800], id=new_id("rs")),
            Message("assistant", (OutputText(output_text),), id=new_id("msg")),
        ),
        usage=Usage(input_tokens=6000, output_tokens=5000),
        completed_at=int(time.time()),
    )


@asynccontextmanager
async def opened(store: str) -> AsyncIterator[StoreHandle]:
    """A store actor on `store` (`memory` or `sqlite:PATH`), stopped after the block."""
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(
            StoreActor(UNBOUNDED, UNBOUNDED, EPHEMERAL_TTL_SECS, store=store).run
        )
        yield handle
        nursery.cancel_scope.cancel()


async def time_open(store: str) -> float:
    """Seconds from the store actor's `run` starting to its handle being ready."""
    async with trio.open_nursery() as nursery:
        started = time.perf_counter()
        await nursery.start(StoreActor(UNBOUNDED, UNBOUNDED, EPHEMERAL_TTL_SECS, store=store).run)
        seconds = time.perf_counter() - started
        nursery.cancel_scope.cancel()
    return seconds


async def fill(handle: StoreHandle, count: int, text: str) -> float:
    """Store `count` responses; the seconds it took."""
    started = time.perf_counter()
    for _ in range(count):
        await checked(handle.put(response(text)))
    return time.perf_counter() - started


async def checked(outcome: Awaitable[bool]) -> None:
    if not await outcome:
        raise RuntimeError("the store refused a response (its limits should hold everything)")


async def put_get(handle: StoreHandle, tasks: int, ops: int, text: str) -> dict[str, float]:
    """`tasks` tasks each putting then getting `ops` responses; latency of the pair and
    pairs per second."""
    latencies: list[float] = []

    async def worker() -> None:
        for _ in range(ops):
            record = response(text)
            started = time.perf_counter()
            await checked(handle.put(record))
            got = await handle.get(record.id)
            latencies.append(time.perf_counter() - started)
            if got is None or got.id != record.id:
                raise RuntimeError(f"{record.id} was put but not found")

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(tasks):
            nursery.start_soon(worker)
    wall = time.perf_counter() - started
    name = f"put_get_{tasks}"
    return {**spread(name, latencies), f"{name}_per_s": len(latencies) / wall}


async def chain(handle: StoreHandle, hops: int, repeats: int, text: str) -> dict[str, float]:
    """`get_chain` of the last of `hops` linked responses, `repeats` times."""
    previous: str | None = None
    for _ in range(hops):
        record = response(text, previous)
        await checked(handle.put(record))
        previous = record.id
    assert previous is not None
    seconds: list[float] = []
    for _ in range(repeats):
        started = time.perf_counter()
        found = await handle.get_chain(previous)
        seconds.append(time.perf_counter() - started)
        if len(found.records) != hops or found.missing is not None:
            raise RuntimeError(f"the chain came back with {len(found.records)} of {hops} hops")
    return spread("chain", seconds)


def spread(name: str, seconds: list[float]) -> dict[str, float]:
    """p50, p99 and max of `seconds`, in ms, under `name_p50_ms` and so on."""
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        f"{name}_p50_ms": 1000 * statistics.median(ordered),
        f"{name}_p99_ms": 1000 * p99,
        f"{name}_max_ms": 1000 * ordered[-1],
    }


async def median_open(store: str, repeats: int, before: Callable[[], None] = lambda: None) -> float:
    """Median ms of `time_open(store)` over `repeats`, calling `before` ahead of each."""
    seconds = []
    for _ in range(repeats):
        before()
        seconds.append(await time_open(store))
    return 1000 * statistics.median(seconds)


def server_start_s(port: int, store: str) -> float:
    """Seconds from the server's process starting to `/health` answering 200."""
    started = time.perf_counter()
    with server(port, 1, store, UNBOUNDED.max_entries, UNBOUNDED.max_bytes):
        return time.perf_counter() - started


async def bench_memory(args: argparse.Namespace, text: str) -> dict[str, float]:
    figures = {"open_empty_ms": await median_open("memory", args.repeats)}
    async with opened("memory") as handle:
        figures["fill_s"] = await fill(handle, args.stored, text)
        figures |= await put_get(handle, 1, args.ops, text)
        figures |= await put_get(handle, args.tasks, args.ops, text)
        figures |= await chain(handle, args.hops, args.chain_repeats, text)
    return figures


class SqliteFiles:
    """The SQLite files of one run: a new one each open, an empty one, a filled one."""

    def __init__(self, folder: Path) -> None:
        self.new = folder / "new.sqlite3"
        self.empty = folder / "empty.sqlite3"
        self.filled = folder / "filled.sqlite3"

    def remove_new(self) -> None:
        for suffix in ("", "-wal", "-shm", ".lock"):
            Path(f"{self.new}{suffix}").unlink(missing_ok=True)


async def sqlite_opens(args: argparse.Namespace, text: str, files: SqliteFiles) -> dict[str, float]:
    """Open times on a new, an empty and a filled file (filling it first)."""
    new, empty, filled = (f"sqlite:{path}" for path in (files.new, files.empty, files.filled))
    figures = {"open_new_ms": await median_open(new, args.repeats, files.remove_new)}
    async with opened(empty):
        pass
    figures["open_empty_ms"] = await median_open(empty, args.repeats)
    async with opened(filled) as handle:
        figures["fill_s"] = await fill(handle, args.stored, text)
    figures["file_mb"] = files.filled.stat().st_size / 1e6
    figures["open_filled_ms"] = await median_open(filled, args.repeats)
    return figures


async def sqlite_operations(
    args: argparse.Namespace, text: str, files: SqliteFiles
) -> dict[str, float]:
    """put+get and the chain on the filled file."""
    async with opened(f"sqlite:{files.filled}") as handle:
        figures = await put_get(handle, 1, args.ops, text)
        figures |= await put_get(handle, args.tasks, args.ops, text)
        return figures | await chain(handle, args.hops, args.chain_repeats, text)


def server_starts(args: argparse.Namespace, files: SqliteFiles) -> dict[str, float]:
    """Server start to `/health`: on memory, on the empty file and on the filled one."""
    stores = {
        "server_memory_ms": "memory",
        "server_empty_ms": f"sqlite:{files.empty}",
        "server_filled_ms": f"sqlite:{files.filled}",
    }
    seconds: dict[str, list[float]] = {key: [] for key in stores}
    for _ in range(args.server_repeats):  # alternating, so a busy spell falls on all three
        for key, store in stores.items():
            seconds[key].append(server_start_s(args.port, store))
    return {key: 1000 * statistics.median(values) for key, values in seconds.items()}


def report(
    args: argparse.Namespace, memory: dict[str, float], sqlite: dict[str, float], text: str
) -> None:
    def row(name: str, key: str, target: str = "") -> None:
        def cell(figures: dict[str, float]) -> str:
            return f"{figures[key]:,.2f}" if key in figures else "-"

        print(f"| {name} | {cell(memory)} | {cell(sqlite)} | {target} |")

    size = encoded_size(response(text))
    print(
        f"responses of {size:,} encoded bytes ({args.output_bytes:,} of output text); "
        f"{args.stored:,} stored first; load average {os.getloadavg()[0]:.2f}"
    )
    print("| measure | memory | sqlite | target |")
    print("|---|---:|---:|---|")
    for tasks in (args.tasks, 1):
        label, key = f"put+get, {tasks} task(s) x {args.ops:,}:", f"put_get_{tasks}"
        row(f"{label} p50 ms", f"{key}_p50_ms", "<= 2 ms" if tasks == args.tasks else "")
        row(f"{label} p99 ms", f"{key}_p99_ms", "<= 20 ms" if tasks == args.tasks else "")
        row(f"{label} max ms", f"{key}_max_ms")
        row(f"{label} pairs/s", f"{key}_per_s")
    row(f"fill {args.stored:,} responses one by one, s", "fill_s")
    row(f"open, new file, ms (median of {args.repeats})", "open_new_ms")
    row("open, empty, ms", "open_empty_ms")
    row(f"open, {args.stored:,} stored, ms ({sqlite['file_mb']:.0f} MB file)", "open_filled_ms")
    sqlite["open_added_ms"] = sqlite["open_filled_ms"] - sqlite["open_empty_ms"]
    row(f"open: added by {args.stored:,} stored, ms", "open_added_ms", "<= 1000 ms")
    if "server_empty_ms" in sqlite:
        every = f"median of {args.server_repeats}"
        row(f"server start to /health, empty, ms ({every})", "server_empty_ms")
        row(f"server start to /health, {args.stored:,} stored, ms", "server_filled_ms")
        sqlite["server_added_ms"] = sqlite["server_filled_ms"] - sqlite["server_empty_ms"]
        row(f"server start: added by {args.stored:,} stored, ms", "server_added_ms", "<= 1000 ms")
    label = f"get_chain, {args.hops} hops, {args.chain_repeats} times:"
    row(f"{label} p50 ms", "chain_p50_ms", "<= 50 ms")
    row(f"{label} p99 ms", "chain_p99_ms", "<= 50 ms")
    print(json.dumps({"memory": memory, "sqlite": sqlite}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=8, help="concurrent put+get tasks")
    parser.add_argument("--ops", type=int, default=1000, help="put+get pairs per task")
    parser.add_argument("--output-bytes", type=int, default=20_000, help="output text per response")
    parser.add_argument("--stored", type=int, default=10_000, help="responses stored first")
    parser.add_argument("--repeats", type=int, default=5, help="store opens per case")
    parser.add_argument("--server-repeats", type=int, default=3, help="0: no server starts")
    parser.add_argument("--hops", type=int, default=50)
    parser.add_argument("--chain-repeats", type=int, default=200)
    parser.add_argument("--port", type=int, default=18932)
    args = parser.parse_args()
    text = prose(args.output_bytes, seed=0)
    memory = trio.run(bench_memory, args, text)
    with tempfile.TemporaryDirectory(prefix="mlxcel-bench-store-") as folder:
        files = SqliteFiles(Path(folder))
        sqlite = trio.run(sqlite_opens, args, text, files)
        if args.server_repeats > 0:  # before the operations add to the filled file
            sqlite |= server_starts(args, files)
        sqlite |= trio.run(sqlite_operations, args, text, files)
    if "server_memory_ms" in sqlite:
        memory["server_empty_ms"] = sqlite.pop("server_memory_ms")
    report(args, memory, sqlite, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
