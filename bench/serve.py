"""Streaming benchmark: mlxcel-server against mlx_lm.server on the same model folder.

For every concurrency level N it fires N streaming requests at once (one thread per
client, official `openai` SDK), measures time to first token, inter-token latency, time
per output token and throughput, prints one table per server plus a ratio table, and
writes the raw numbers to `bench/results/<timestamp>.json` (and PNG plots when
matplotlib is importable). See bench/README.md for the metric definitions.

Run from the repository root:

    .venv/bin/python bench/serve.py                  # both servers, levels 1,4,16,64
    .venv/bin/python bench/serve.py --levels 1,4 --only ours

The two servers are started one after the other, never together, and always stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import httpx
import openai
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseErrorEvent,
    ResponseFailedEvent,
    ResponseIncompleteEvent,
    ResponseTextDeltaEvent,
)

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
DEFAULT_LEVELS = (1, 4, 16, 64)
OUR_ALIAS = "bench"
PEER_MODEL = "default_model"  # mlx_lm.server's name for the folder given by --model
PREFIX_TOKENS = 35
PROMPT_TOKENS = 95
LOG_TAIL_LINES = 40
OTHER_CPU_WARN_PCT = 5.0

Kind = Literal["ours", "peer"]

# The peer runs under the same BLAS routing as our server: `load_fast_blas()` before
# anything imports mlx.core, then mlx_lm.server's own `main()`.
PEER_BOOT = """\
import sys
from mlxcel.model.blas import describe, load_fast_blas
info = load_fast_blas()
print(describe(info), flush=True)
model, port, decode, prompt = sys.argv[1:5]
sys.argv = ["mlx_lm.server", "--model", model, "--host", "127.0.0.1", "--port", port,
            "--decode-concurrency", decode, "--prompt-concurrency", prompt]
from mlx_lm.server import main
main()
"""

# ---------------------------------------------------------------------------------------
# Prompts: distinct, ~95 tokens, sharing a ~35-token prefix.

PREFIX = (
    "You are a senior Python engineer reviewing a small logistics code base. Reply with "
    "complete, fully type-annotated Python code only: no prose, no explanations, no "
    "markdown headings. "
)
VERBS = (
    "parse",
    "validate",
    "merge",
    "summarise",
    "group",
    "rank",
    "filter",
    "schedule",
    "reconcile",
    "estimate",
    "normalise",
    "split",
    "deduplicate",
    "route",
    "price",
)
NOUNS = (
    "shipments",
    "invoices",
    "pallets",
    "routes",
    "drivers",
    "warehouses",
    "orders",
    "parcels",
    "customs_forms",
    "delivery_slots",
    "fuel_logs",
    "containers",
)
DETAILS = (
    "Use dataclasses for the records and raise ValueError with a helpful message on bad input.",
    "Accept an iterable of dictionaries read from a CSV export and return a sorted list.",
    "Handle missing fields, empty strings and negative weights gracefully.",
    "Include a small command line entry point built with argparse that prints a summary.",
    "Keep the public function pure and put all input and output in a separate helper.",
    "Group the results by ISO week and compute totals, averages and the maximum per group.",
    "Write docstrings for every public function and add three doctest examples.",
    "Times are UTC ISO 8601 strings; convert them with datetime.fromisoformat.",
    "Weights are in kilograms and distances in kilometres; round money to two decimals.",
    "Log skipped rows with the logging module at warning level, never print them.",
)


class TokenCounter:
    """Counts tokens with the model's own tokenizer when available, else by words."""

    def __init__(self, model_dir: Path | None) -> None:
        self._tok: Any = None
        path = model_dir / "tokenizer.json" if model_dir is not None else None
        if path is not None and path.is_file():
            tokenizers = importlib.import_module("tokenizers")
            self._tok = tokenizers.Tokenizer.from_file(str(path))

    @property
    def exact(self) -> bool:
        return self._tok is not None

    def count(self, text: str) -> int:
        if self._tok is None:
            return round(len(text.split()) * 1.3)
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def truncate(self, text: str, tokens: int) -> str:
        if self._tok is None:
            return " ".join(text.split()[: max(1, round(tokens / 1.3))])
        ids = self._tok.encode(text, add_special_tokens=False).ids[:tokens]
        return str(self._tok.decode(ids))


def make_prompt(uid: str, counter: TokenCounter) -> str:
    """The shared prefix plus a request-specific task, ~PROMPT_TOKENS tokens in all."""
    rng = random.Random(uid)
    verb, noun = rng.choice(VERBS), rng.choice(NOUNS)
    details = list(DETAILS)
    rng.shuffle(details)
    body = f"Ticket {uid}: implement `{verb}_{noun}(rows)` to {verb} {noun.replace('_', ' ')}."
    budget = PROMPT_TOKENS - counter.count(PREFIX)
    for line in details:
        if counter.count(body) >= budget:
            break
        body += " " + line
    return PREFIX + counter.truncate(body, budget)


# ---------------------------------------------------------------------------------------
# One streaming request.


@dataclass
class RequestResult:
    index: int
    start: float
    """Seconds from the level's start to sending the request."""
    first_token: float | None = None
    """Seconds from the level's start to the first non-empty text delta."""
    end: float | None = None
    """Seconds from the level's start to the end of the stream (or the failure)."""
    deltas: int = 0
    gaps: list[float] = field(default_factory=list)
    """Seconds between consecutive non-empty text deltas."""
    output_tokens: int = 0
    usage_reported: bool = False
    prompt_tokens: int | None = None
    finish: str | None = None
    text_chars: int = 0
    error: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.first_token is not None and self.end is not None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    @property
    def tpot(self) -> float | None:
        if self.first_token is None or self.end is None or self.output_tokens < 2:
            return None
        return (self.end - self.first_token) / (self.output_tokens - 1)

    @property
    def tokens_per_s(self) -> float | None:
        if self.end is None or self.end <= self.start:
            return None
        return self.output_tokens / (self.end - self.start)


class _Clock:
    """Records text deltas against a shared origin and enforces the request deadline."""

    def __init__(self, result: RequestResult, origin: float, deadline: float) -> None:
        self.result = result
        self.origin = origin
        self.deadline = deadline
        self._last: float | None = None

    def now(self) -> float:
        t = time.perf_counter()
        if t > self.deadline:
            raise TimeoutError("request exceeded --timeout")
        return t - self.origin

    def text(self, chunk: str | None) -> None:
        t = self.now()
        if not chunk:
            return
        r = self.result
        if r.first_token is None:
            r.first_token = t
        elif self._last is not None:
            r.gaps.append(t - self._last)
        self._last = t
        r.deltas += 1
        r.text_chars += len(chunk)


def _error(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, openai.APIStatusError):
        body: Any
        try:
            body = exc.response.json()
        except ValueError:
            body = exc.response.text[:2000]
        return {
            "kind": type(exc).__name__,
            "status": exc.status_code,
            "message": str(exc),
            "body": body,
        }
    cause = exc.__cause__ or exc.__context__
    return {
        "kind": type(exc).__name__,
        "status": None,
        "message": str(exc) or repr(exc),
        "cause": None if cause is None else f"{type(cause).__name__}: {cause}",
        "body": None,
    }


def stream_ours(
    client: openai.OpenAI, model: str, prompt: str, max_tokens: int, clock: _Clock
) -> None:
    r = clock.result
    stream = client.responses.create(
        model=model,
        input=prompt,
        max_output_tokens=max_tokens,
        temperature=0,
        stream=True,
    )
    with stream:
        for event in stream:
            if isinstance(event, ResponseTextDeltaEvent):
                clock.text(event.delta)
                continue
            clock.now()
            if isinstance(event, ResponseCompletedEvent | ResponseIncompleteEvent):
                r.finish = event.response.status
                if event.response.usage is not None:
                    r.output_tokens = event.response.usage.output_tokens
                    r.prompt_tokens = event.response.usage.input_tokens
                    r.usage_reported = True
            elif isinstance(event, ResponseFailedEvent):
                err = event.response.error
                r.error = {
                    "kind": "response.failed",
                    "status": 200,
                    "message": err.message if err else "",
                    "body": event.to_dict(),
                }
            elif isinstance(event, ResponseErrorEvent):
                r.error = {
                    "kind": "stream error event",
                    "status": 200,
                    "message": event.message,
                    "body": event.to_dict(),
                }


def stream_peer(
    client: openai.OpenAI, model: str, prompt: str, max_tokens: int, clock: _Clock
) -> None:
    r = clock.result
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    with stream:
        for chunk in stream:
            for choice in chunk.choices:
                clock.text(choice.delta.content)
                if choice.finish_reason is not None:
                    r.finish = choice.finish_reason
            clock.now()
            if chunk.usage is not None:
                r.output_tokens = chunk.usage.completion_tokens
                r.prompt_tokens = chunk.usage.prompt_tokens
                r.usage_reported = True


Streamer = Callable[[openai.OpenAI, str, str, int, _Clock], None]
STREAMERS: dict[Kind, Streamer] = {"ours": stream_ours, "peer": stream_peer}


def run_request(
    streamer: Streamer,
    client: openai.OpenAI,
    model: str,
    prompt: str,
    max_tokens: int,
    result: RequestResult,
    origin: float,
    deadline: float,
) -> None:
    clock = _Clock(result, origin, deadline)
    try:
        streamer(client, model, prompt, max_tokens, clock)
    except Exception as exc:
        result.error = _error(exc)
    result.end = time.perf_counter() - origin
    if not result.usage_reported:
        result.output_tokens = result.deltas  # best effort: one delta per token
    if result.error is None and result.finish is None:
        result.error = {
            "kind": "no terminal event",
            "status": 200,
            "message": "the stream ended without a completed/incomplete event or finish_reason",
            "body": None,
        }
    if result.error is None and result.first_token is None:
        result.error = {
            "kind": "no text",
            "status": 200,
            "finish": result.finish,
            "message": "the stream ended without any text delta",
            "body": None,
        }


# ---------------------------------------------------------------------------------------
# One concurrency level.


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation, None when empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass
class CpuSample:
    """Cumulative CPU seconds: the whole machine (busy), the server, this process."""

    busy: float | None
    server: float | None
    bench: float

    @classmethod
    def take(cls, server_pid: int | None) -> CpuSample:
        times = os.times()
        return cls(_machine_busy(), _process_cpu(server_pid), times.user + times.system)


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _machine_busy() -> float | None:
    """Busy CPU seconds of all cores since boot (Linux), None elsewhere."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / _TICKS


def _process_cpu(pid: int | None) -> float | None:
    """User + system CPU seconds of one process and its reaped children (Linux)."""
    if pid is None:
        return None
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return sum(int(x) for x in rest[11:15]) / _TICKS
    except (OSError, ValueError, IndexError):
        return None


def cpu_shares(before: CpuSample, after: CpuSample, wall: float) -> dict[str, float | None]:
    """Percent of all cores used by the server, the benchmark and everything else."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    capacity = wall * (cores or 1)

    def pct(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None or capacity <= 0 else 100.0 * (b - a) / capacity

    server = pct(before.server, after.server)
    bench = pct(before.bench, after.bench)
    busy = pct(before.busy, after.busy)
    other = None
    if busy is not None and bench is not None:
        other = max(0.0, busy - bench - (server or 0.0))
    return {"server_cpu_pct": server, "bench_cpu_pct": bench, "other_cpu_pct": other}


@dataclass
class LevelResult:
    n: int
    wall_s: float
    requests: list[RequestResult]
    cpu: dict[str, float | None] = field(default_factory=dict)
    attempt: int = 1

    def summary(self) -> dict[str, Any]:
        ok = [r for r in self.requests if r.ok]
        ttfts = [t for r in ok if (t := r.ttft) is not None]
        gaps = [g for r in ok for g in r.gaps]
        tpots = [t for r in ok if (t := r.tpot) is not None]
        rates = [t for r in ok if (t := r.tokens_per_s) is not None]
        prompts = [float(r.prompt_tokens) for r in ok if r.prompt_tokens is not None]
        tokens = sum(r.output_tokens for r in ok)
        return {
            "n": self.n,
            "requests": len(self.requests),
            "errors": len(self.requests) - len(ok),
            "wall_s": self.wall_s,
            "output_tokens": tokens,
            "prompt_tokens_mean": mean(prompts),
            "ttft_p50_ms": _ms(percentile(ttfts, 50)),
            "ttft_p99_ms": _ms(percentile(ttfts, 99)),
            "itl_p50_ms": _ms(percentile(gaps, 50)),
            "itl_p99_ms": _ms(percentile(gaps, 99)),
            "tpot_mean_ms": _ms(mean(tpots)),
            "agg_tok_s": tokens / self.wall_s if self.wall_s > 0 else None,
            "req_tok_s_mean": mean(rates),
            "attempt": self.attempt,
            **self.cpu,
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def make_client(base_url: str, timeout: float) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=base_url.rstrip("/") + "/v1",
        api_key=os.environ.get("MLXCEL_BENCH_API_KEY", "bench"),
        max_retries=0,
        timeout=openai.Timeout(timeout, connect=10.0),
    )


def run_level(
    kind: Kind,
    base_url: str,
    model: str,
    prompts: Sequence[str],
    max_tokens: int,
    timeout: float,
    server_pid: int | None = None,
) -> LevelResult:
    """Fire len(prompts) streams at once; returns when all ended or --timeout passed."""
    n = len(prompts)
    client = make_client(base_url, timeout)
    barrier = threading.Barrier(n + 1)
    results = [RequestResult(index=i, start=0.0) for i in range(n)]
    origin_box: list[float] = []

    def worker(i: int) -> None:
        barrier.wait()
        origin = origin_box[0]
        results[i].start = time.perf_counter() - origin
        run_request(
            STREAMERS[kind],
            client,
            model,
            prompts[i],
            max_tokens,
            results[i],
            origin,
            origin + timeout,
        )

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    cpu_before = CpuSample.take(server_pid)
    origin_box.append(time.perf_counter())
    barrier.wait()
    hard_deadline = origin_box[0] + timeout + 30.0  # the read timeout can add to --timeout
    for t in threads:
        # Short slices: a long lock wait would delay Ctrl-C / SIGTERM until it returns.
        while t.is_alive() and time.perf_counter() < hard_deadline:
            t.join(0.5)
    for t, r in zip(threads, results, strict=True):
        if t.is_alive() and r.end is None:
            r.end = time.perf_counter() - origin_box[0]
            r.error = {
                "kind": "hung",
                "status": None,
                "body": None,
                "message": "the client thread did not finish before the deadline",
            }
    wall = max((r.end or 0.0) for r in results)
    cpu = cpu_shares(cpu_before, CpuSample.take(server_pid), time.perf_counter() - origin_box[0])
    client.close()
    return LevelResult(n=n, wall_s=wall, requests=results, cpu=cpu)


# ---------------------------------------------------------------------------------------
# Server processes.


class ServerStartError(RuntimeError):
    pass


@dataclass
class Server:
    kind: Kind
    base_url: str
    model: str
    command: list[str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    stopped: dict[str, Any] | None = None
    """How the process ended: the signal that did it, its exit code, seconds taken."""

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log: the server was not started by the benchmark)"
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def blas_line(self) -> str | None:
        if self.log_path is None or not self.log_path.exists():
            return None
        for line in self.log_path.read_text(errors="replace").splitlines():
            if "BLAS:" in line:
                return line[line.index("BLAS:") :]
        return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def our_command(model_dir: Path, port: int, parallel: int) -> list[str]:
    exe = Path(sys.executable).with_name("mlxcel-server")
    program = str(exe) if exe.exists() else shutil.which("mlxcel-server")
    if program is None:
        raise ServerStartError("mlxcel-server is not installed in this environment")
    return [
        program,
        "--model",
        str(model_dir),
        "--alias",
        OUR_ALIAS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--parallel",
        str(parallel),
        "--max-queue-depth",
        "256",
    ]


def peer_command(model_dir: Path, port: int, parallel: int, prompt_concurrency: int) -> list[str]:
    return [
        sys.executable,
        "-c",
        PEER_BOOT,
        str(model_dir),
        str(port),
        str(parallel),
        str(prompt_concurrency),
    ]


def start_server(
    kind: Kind, command: list[str], port: int, model: str, log_path: Path, startup_timeout: float
) -> Server:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        # Its own session, so stopping it reaches every child; cwd outside the checkout so
        # the repository's top-level modules can never shadow anything the server imports.
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=server_env(),
            cwd=log_path.parent,
            start_new_session=True,
        )
    server = Server(kind, f"http://127.0.0.1:{port}", model, command, proc, log_path)
    try:
        wait_healthy(server, startup_timeout)
    except BaseException:
        stop_server(server)
        raise
    return server


def wait_healthy(server: Server, timeout: float) -> None:
    """Poll GET /health until 200, then warm up with one short request until it succeeds.

    The warm-up is needed as well: mlx_lm.server answers /health with 200 before its
    model is loaded, and the first request of either server pays one-off compile costs.
    """
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    with httpx.Client(timeout=5.0) as http:
        while True:
            _check_alive(server)
            try:
                reply = http.get(server.base_url + "/health")
                if reply.status_code == 200:
                    break
                last = f"HTTP {reply.status_code}: {reply.text[:200]}"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"{server.kind} server not healthy after {timeout:.0f}s ({last}); "
                    f"log tail:\n{server.log_tail()}"
                )
            time.sleep(0.5)
    client = make_client(server.base_url, max(5.0, deadline - time.monotonic()))
    try:
        while True:
            _check_alive(server)
            origin = time.perf_counter()
            result = RequestResult(index=-1, start=0.0)
            run_request(
                STREAMERS[server.kind],
                client,
                server.model,
                "Say hello in one short sentence.",
                8,
                result,
                origin,
                origin + max(5.0, deadline - time.monotonic()),
            )
            if result.ok:
                return
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"{server.kind} server: warm-up request failed: {result.error}; "
                    f"log tail:\n{server.log_tail()}"
                )
            time.sleep(1.0)
    finally:
        client.close()


def _check_alive(server: Server) -> None:
    if server.proc is not None and (code := server.proc.poll()) is not None:
        raise ServerStartError(
            f"{server.kind} server exited with code {code} during start-up; "
            f"log tail:\n{server.log_tail()}"
        )


def stop_server(server: Server) -> None:
    """SIGINT to the server's process group, then SIGTERM and SIGKILL after grace periods."""
    proc = server.proc
    if proc is None:
        return
    if proc.poll() is not None:
        server.stopped = {"signal": None, "returncode": proc.returncode, "seconds": 0.0}
        return
    t0 = time.monotonic()
    for sig, grace in ((signal.SIGINT, 10.0), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            continue
        server.stopped = {
            "signal": sig.name,
            "returncode": proc.returncode,
            "seconds": round(time.monotonic() - t0, 2),
        }
        return


@contextlib.contextmanager
def running(server_factory: Callable[[], Server]) -> Iterator[Server]:
    server = server_factory()
    try:
        yield server
    finally:
        stop_server(server)


def other_cpu_pct(seconds: float = 2.0) -> float | None:
    """Percent of all cores busy over `seconds`, not counting this process."""
    before = CpuSample.take(None)
    time.sleep(seconds)
    return cpu_shares(before, CpuSample.take(None), seconds)["other_cpu_pct"]


def wait_for_idle(max_wait: float) -> float | None:
    """Wait up to `max_wait` seconds for the machine to be quiet; returns the last reading."""
    deadline = time.monotonic() + max_wait
    while True:
        busy = other_cpu_pct()
        if busy is None or busy <= OTHER_CPU_WARN_PCT:
            return busy
        if time.monotonic() >= deadline:
            print(
                f"warning: other processes keep {busy:.0f}% of the CPU busy; "
                "results will be skewed",
                flush=True,
            )
            return busy
        if max_wait > 0:
            print(f"other processes use {busy:.0f}% of the CPU; waiting ...", flush=True)
        time.sleep(3.0)


def our_model_name(base_url: str) -> str:
    """The first model id an already running server lists."""
    reply = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=10.0)
    reply.raise_for_status()
    return str(reply.json()["data"][0]["id"])


# ---------------------------------------------------------------------------------------
# Reporting.

COLUMNS = (
    ("N", "n", "{:d}"),
    ("TTFT p50 ms", "ttft_p50_ms", "{:.0f}"),
    ("TTFT p99 ms", "ttft_p99_ms", "{:.0f}"),
    ("ITL p50 ms", "itl_p50_ms", "{:.1f}"),
    ("ITL p99 ms", "itl_p99_ms", "{:.1f}"),
    ("TPOT mean ms", "tpot_mean_ms", "{:.1f}"),
    ("agg tok/s", "agg_tok_s", "{:.1f}"),
    ("req tok/s mean", "req_tok_s_mean", "{:.2f}"),
    ("errors", "errors", "{:d}"),
)


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else spec.format(value)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    rule = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    body = [
        "| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows
    ]
    return "\n".join([line, rule, *body])


def server_table(summaries: Sequence[dict[str, Any]]) -> str:
    rows = [[_fmt(s[key], spec) for _, key, spec in COLUMNS] for s in summaries]
    return markdown_table([h for h, _, _ in COLUMNS], rows)


def ratios(ours: Sequence[dict[str, Any]], peer: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    peer_by_n = {s["n"]: s for s in peer}
    out = []
    for s in ours:
        p = peer_by_n.get(s["n"])
        if p is None:
            continue
        out.append(
            {
                "n": s["n"],
                "agg_tok_s": _ratio(s["agg_tok_s"], p["agg_tok_s"]),
                "ttft_p50": _ratio(s["ttft_p50_ms"], p["ttft_p50_ms"]),
                "ttft_p99": _ratio(s["ttft_p99_ms"], p["ttft_p99_ms"]),
            }
        )
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def ratio_table(rows: Sequence[dict[str, Any]]) -> str:
    headers = ["N", "agg tok/s ours/peer", "TTFT p50 ours/peer", "TTFT p99 ours/peer"]
    body = [
        [
            str(r["n"]),
            _fmt(r["agg_tok_s"], "{:.2f}"),
            _fmt(r["ttft_p50"], "{:.2f}"),
            _fmt(r["ttft_p99"], "{:.2f}"),
        ]
        for r in rows
    ]
    return markdown_table(headers, body)


def plot(report: dict[str, Any], stem: Path) -> list[Path]:
    """PNG plots next to the JSON when matplotlib is importable; [] otherwise."""
    try:
        matplotlib: Any = importlib.import_module("matplotlib")
    except ImportError:
        return []
    matplotlib.use("Agg")
    plt: Any = importlib.import_module("matplotlib.pyplot")
    written = []
    series = {k: v["summary"] for k, v in report["servers"].items()}
    charts = (
        ("throughput", "aggregate output tok/s", [("agg_tok_s", "")]),
        ("ttft", "TTFT (ms)", [("ttft_p50_ms", " p50"), ("ttft_p99_ms", " p99")]),
    )
    for name, ylabel, keys in charts:
        fig, ax = plt.subplots(figsize=(6, 4))
        for kind, summaries in series.items():
            label = "mlxcel" if kind == "ours" else "mlx_lm.server"
            for key, suffix in keys:
                points = [(s["n"], s[key]) for s in summaries if s[key] is not None]
                if points:
                    xs, ys = zip(*points, strict=True)
                    ax.plot(xs, ys, marker="o", label=label + suffix)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streams (N)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend()
        fig.tight_layout()
        path = stem.with_name(f"{stem.name}-{name}.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    mem = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = round(int(line.split()[1]) / 1024 / 1024, 1)
    cpu = platform.processor() or None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "mem_gib": mem,
        "python": platform.python_version(),
        "versions": {d: _version(d) for d in ("mlx", "mlx-lm", "mlxcel", "openai")},
        "thread_env": {
            k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MLXCEL_BLAS")
        },
    }


# ---------------------------------------------------------------------------------------
# Main.


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--levels {text!r}: comma-separated integers") from exc
    if not levels or any(n < 1 for n in levels):
        raise argparse.ArgumentTypeError("--levels needs positive integers, e.g. 1,4,16,64")
    return levels


def default_model_dir() -> Path | None:
    try:
        fetch = importlib.import_module("mlxcel.model.fetch")
    except ImportError:
        return None
    return Path(fetch.default_model_dir())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench/serve.py",
        description="Streaming latency/throughput benchmark: mlxcel-server vs mlx_lm.server.",
    )
    p.add_argument(
        "--model",
        type=Path,
        default=None,
        help="MLX model folder served by both (default: the embedded default model)",
    )
    p.add_argument(
        "--levels",
        type=parse_levels,
        default=list(DEFAULT_LEVELS),
        help="comma-separated concurrency levels (default: 1,4,16,64)",
    )
    p.add_argument(
        "--max-tokens", type=int, default=64, help="max output tokens per request (default: 64)"
    )
    p.add_argument("--only", choices=("ours", "peer"), default=None, help="bench one server only")
    p.add_argument(
        "--our-url", default=None, help="bench an already running mlxcel server at this base URL"
    )
    p.add_argument(
        "--peer-url", default=None, help="bench an already running mlx_lm.server at this base URL"
    )
    p.add_argument(
        "--parallel",
        type=int,
        default=None,
        help="our --parallel and the peer's --decode-concurrency (default: the largest level)",
    )
    p.add_argument(
        "--prompt-concurrency",
        type=int,
        default=None,
        help="the peer's --prompt-concurrency (default: min(parallel, 8), "
        "matching our prefill batch)",
    )
    p.add_argument(
        "--timeout", type=float, default=600.0, help="seconds allowed for each level (default: 600)"
    )
    p.add_argument(
        "--startup-timeout",
        type=float,
        default=600.0,
        help="seconds allowed for a server to load and answer (default: 600)",
    )
    p.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        help="before starting each server and each level, wait up to this many seconds for other "
        f"processes to use under {OTHER_CPU_WARN_PCT:.0f}%% of the CPU (default: 0, only warn)",
    )
    p.add_argument(
        "--busy-retries",
        type=int,
        default=0,
        help="re-run a level (with fresh prompts) up to this many times when other processes "
        f"used over {OTHER_CPU_WARN_PCT:.0f}%% of the CPU during it (default: 0)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=RESULTS_DIR,
        help="directory for the JSON, plots and server logs (default: bench/results)",
    )
    return p


def bench_server(
    server: Server,
    levels: Sequence[int],
    max_tokens: int,
    timeout: float,
    prompts: Callable[[int, int], list[str]],
    wait_idle: float = 0.0,
    busy_retries: int = 0,
) -> dict[str, Any]:
    """Run every level against one server; a level disturbed by other processes is re-run
    (with fresh prompts, so no prompt cache helps) up to `busy_retries` times."""
    label = "mlxcel" if server.kind == "ours" else "mlx_lm.server"
    pid = server.proc.pid if server.proc is not None else None
    level_results = []
    tried: list[dict[str, Any]] = []
    for n in levels:
        attempts: list[LevelResult] = []
        for attempt in range(1, busy_retries + 2):
            if wait_idle > 0:
                wait_for_idle(wait_idle)
            print(f"[{label}] N={n}: {n} streams x {max_tokens} tokens ...", flush=True)
            result = run_level(
                server.kind,
                server.base_url,
                server.model,
                prompts(n, attempt),
                max_tokens,
                timeout,
                pid,
            )
            result.attempt = attempt
            attempts.append(result)
            summary = result.summary()
            tried.append(summary)
            print(
                f"[{label}] N={n}: {summary['wall_s']:.1f}s, {summary['agg_tok_s'] or 0:.1f} "
                f"tok/s, {summary['errors']} errors; CPU: server "
                f"{_fmt(summary['server_cpu_pct'], '{:.0f}')}%, bench "
                f"{_fmt(summary['bench_cpu_pct'], '{:.0f}')}%, other processes "
                f"{_fmt(summary['other_cpu_pct'], '{:.0f}')}%",
                flush=True,
            )
            for r in result.requests:
                if r.error is not None:
                    print(f"[{label}]   request {r.index}: {json.dumps(r.error)[:600]}", flush=True)
            time.sleep(1.0)
            other = summary["other_cpu_pct"]
            if other is None or other <= OTHER_CPU_WARN_PCT:
                break
            if attempt <= busy_retries:
                print(
                    f"[{label}]   other processes used {other:.0f}% of the CPU; "
                    "re-running this level",
                    flush=True,
                )
            else:
                print(
                    f"[{label}]   warning: other processes used {other:.0f}% of the CPU during "
                    "this level; the least disturbed attempt is kept, its numbers are skewed",
                    flush=True,
                )
        # The least disturbed attempt stands for the level.
        level_results.append(min(attempts, key=lambda r: r.cpu.get("other_cpu_pct") or 0.0))
    return {
        "label": label,
        "base_url": server.base_url,
        "model": server.model,
        "command": server.command,
        "blas": server.blas_line(),
        "summary": [r.summary() for r in level_results],
        "all_attempts": tried,
        "levels": [
            {
                "n": r.n,
                "wall_s": r.wall_s,
                "requests": [
                    asdict(q) | {"ttft": q.ttft, "tpot": q.tpot, "tokens_per_s": q.tokens_per_s}
                    for q in r.requests
                ],
            }
            for r in level_results
        ],
        "log_tail": server.log_tail()
        if any(s["errors"] for s in (r.summary() for r in level_results))
        else None,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    levels: list[int] = args.levels
    parallel: int = args.parallel or max(levels)
    prompt_concurrency: int = args.prompt_concurrency or min(parallel, 8)
    kinds: list[Kind] = [args.only] if args.only else ["ours", "peer"]

    model_dir: Path | None = args.model.expanduser().resolve() if args.model else None
    needs_folder = ("ours" in kinds and not args.our_url) or ("peer" in kinds and not args.peer_url)
    if model_dir is None:
        model_dir = default_model_dir()
        if needs_folder and model_dir is None:
            print(
                "error: no --model given and the default model location is unknown", file=sys.stderr
            )
            return 2
    if needs_folder:
        assert model_dir is not None
        if not (model_dir / "config.json").is_file():
            print(
                f"error: {model_dir} is not an MLX model folder (no config.json); run "
                "`mlxcel fetch-model` or pass --model",
                file=sys.stderr,
            )
            return 2

    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    counter = TokenCounter(model_dir)

    def prompts(n: int, attempt: int) -> list[str]:
        tag = f"{n}" if attempt == 1 else f"{n}.{attempt}"
        return [make_prompt(f"{tag}-{i}", counter) for i in range(n)]

    report: dict[str, Any] = {
        "timestamp": stamp,
        "machine": machine(),
        "model": str(model_dir) if model_dir else None,
        "levels": levels,
        "max_tokens": args.max_tokens,
        "parallel": parallel,
        "peer_prompt_concurrency": prompt_concurrency,
        "prompt": {
            "target_tokens": PROMPT_TOKENS,
            "prefix_tokens": counter.count(PREFIX),
            "counted_with": "model tokenizer" if counter.exact else "word estimate",
            "example": prompts(levels[0], 1)[0],
        },
        "servers": {},
    }

    # Ctrl-C and SIGTERM both unwind through the finally blocks that stop the servers.
    # Installing a handler for SIGINT also matters when this runs in the background, where
    # the shell ignores SIGINT: an ignored signal stays ignored in the servers we start,
    # while a handled one is reset to the default when they exec.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    failures: list[str] = []
    for kind in kinds:
        url = args.our_url if kind == "ours" else args.peer_url

        def factory(kind: Kind = kind, url: str | None = url) -> Server:
            if url is not None:
                model = our_model_name(url) if kind == "ours" else PEER_MODEL
                server = Server(kind, url.rstrip("/"), model)
                wait_healthy(server, args.startup_timeout)
                return server
            assert model_dir is not None
            port = free_port()
            command = (
                our_command(model_dir, port, parallel)
                if kind == "ours"
                else peer_command(model_dir, port, parallel, prompt_concurrency)
            )
            print(f"starting {kind} server on port {port} ...", flush=True)
            t0 = time.monotonic()
            server = start_server(
                kind,
                command,
                port,
                OUR_ALIAS if kind == "ours" else PEER_MODEL,
                out_dir / f"{stamp}-{kind}.log",
                args.startup_timeout,
            )
            print(f"{kind} server ready in {time.monotonic() - t0:.1f}s", flush=True)
            return server

        wait_for_idle(args.wait_idle)
        try:
            with running(factory) as server:
                entry = bench_server(
                    server,
                    levels,
                    args.max_tokens,
                    args.timeout,
                    prompts,
                    args.wait_idle,
                    args.busy_retries,
                )
            entry["stopped"] = server.stopped
            report["servers"][kind] = entry
            if server.stopped and server.stopped["signal"] != "SIGINT":
                print(f"note: {kind} server did not stop on SIGINT: {server.stopped}", flush=True)
        except (ServerStartError, httpx.HTTPError, OSError) as exc:
            failures.append(f"{kind}: {exc}")
            print(f"error: {kind} server: {exc}", file=sys.stderr, flush=True)

    servers = report["servers"]
    if "ours" in servers and "peer" in servers:
        report["ratios"] = ratios(servers["ours"]["summary"], servers["peer"]["summary"])
    report["failures"] = failures
    json_path = out_dir / f"{stamp}.json"
    json_path.write_text(json.dumps(report, indent=2))

    print()
    print(
        f"model: {report['model']}, {args.max_tokens} max output tokens, "
        f"prompt ~{PROMPT_TOKENS} tokens (shared prefix ~{PREFIX_TOKENS})"
    )
    for kind in kinds:
        if kind in servers:
            s = servers[kind]
            blas = re.sub(r", from [^,\s]+", "", s["blas"] or "BLAS not logged")
            print(f"\n{s['label']} ({blas})\n")
            print(server_table(s["summary"]))
    if "ratios" in report:
        print("\nratios (ours / peer): tok/s above 1 and TTFT below 1 favour mlxcel\n")
        print(ratio_table(report["ratios"]))
    plots = plot(report, json_path.with_suffix("")) if servers else []
    print(f"\nraw numbers: {json_path}")
    for path in plots:
        print(f"plot: {path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
