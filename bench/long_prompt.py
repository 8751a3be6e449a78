"""The long-prompt level: a few long prompts arrive while many streams are decoding.

S streams with the usual short prompts start at once; when every one of them has
streamed a few tokens, K requests with ~P-token prompts are sent together. The question
is what the long prompts' prefill does to the streams already running: how long the
largest pause between two of their tokens gets while the long prompts are read, against
their usual inter-token latency, and how soon the long requests see their first token.

The *window* runs from the long requests' arrival to the last long request's first token
(or its failure). A stream's gap counts in the window when it overlaps it: it ends after
the arrival and starts before the window's end. See bench/README.md for the metrics.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from clients import STREAMERS, Kind, RequestResult, join_all, make_client, run_request
from load import OTHER_CPU_WARN_PCT, CpuSample, cpu_shares, wait_for_idle
from report import LABELS, fmt, markdown_table, mean, ms, percentile
from servers import Server

DEFAULT_STREAMS = 32
DEFAULT_REQUESTS = 4
DEFAULT_PROMPT_TOKENS = 1500
DEFAULT_STREAM_TOKENS = 192
LONG_OUTPUT_TOKENS = 16
"""Output limit of a long request: only its first token is measured."""
MIN_TOKENS = 3
"""Text deltas every stream has received before the long requests are sent."""


@dataclass(frozen=True)
class LongConfig:
    streams: int = DEFAULT_STREAMS
    requests: int = DEFAULT_REQUESTS
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS
    stream_tokens: int = DEFAULT_STREAM_TOKENS

    @property
    def parallel(self) -> int:
        """Slots for the level's server: every stream and every long request at once."""
        return self.streams + self.requests


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--long-level",
        action="store_true",
        help="run the long-prompt level (after the --levels sweep; --levels '' for it alone)",
    )
    p.add_argument(
        "--long-streams",
        type=int,
        default=DEFAULT_STREAMS,
        help=f"streams decoding when the long prompts arrive (default: {DEFAULT_STREAMS})",
    )
    p.add_argument(
        "--long-requests",
        type=int,
        default=DEFAULT_REQUESTS,
        help=f"long-prompt requests sent together (default: {DEFAULT_REQUESTS})",
    )
    p.add_argument(
        "--long-prompt-tokens",
        type=int,
        default=DEFAULT_PROMPT_TOKENS,
        help=f"tokens in each long prompt (default: {DEFAULT_PROMPT_TOKENS})",
    )
    p.add_argument(
        "--long-stream-tokens",
        type=int,
        default=DEFAULT_STREAM_TOKENS,
        help="output token limit of the decoding streams, enough for them to outlast the "
        f"long prompts' prefill (default: {DEFAULT_STREAM_TOKENS})",
    )


def config_from(args: argparse.Namespace) -> LongConfig | None:
    """The level's settings, None when it is not requested; ValueError when invalid."""
    if not args.long_level:
        return None
    config = LongConfig(
        args.long_streams, args.long_requests, args.long_prompt_tokens, args.long_stream_tokens
    )
    if min(config.streams, config.requests) < 1 or config.stream_tokens <= MIN_TOKENS:
        raise ValueError(
            f"--long-streams and --long-requests need at least 1, --long-stream-tokens "
            f"more than {MIN_TOKENS}"
        )
    if config.prompt_tokens < 200:
        raise ValueError("--long-prompt-tokens needs at least 200")
    return config


def _times(r: RequestResult) -> list[float]:
    """When each text delta arrived: the first token, then one per recorded gap."""
    if r.first_token is None:
        return []
    out = [r.first_token]
    for gap in r.gaps:
        out.append(out[-1] + gap)
    return out


@dataclass
class LongResult:
    config: LongConfig
    streams: list[RequestResult]
    long: list[RequestResult]
    arrival: float
    """Seconds from the level's start to sending the long requests."""
    tokens_at_arrival: list[int]
    wall_s: float
    cpu: dict[str, float | None] = field(default_factory=dict)
    attempt: int = 1

    @property
    def window_end(self) -> float:
        """The last long request's first token (or its end, when it had none)."""
        ends = [r.first_token if r.first_token is not None else r.end for r in self.long]
        return max((e for e in ends if e is not None), default=self.arrival)

    def window_gaps(self) -> list[float]:
        a, b = self.arrival, self.window_end
        out = []
        for r in self.streams:
            if r.ok:
                ts = _times(r)
                out += [
                    g for g, t0, t1 in zip(r.gaps, ts, ts[1:], strict=False) if t1 > a and t0 < b
                ]
        return out

    def summary(self) -> dict[str, Any]:
        ok = [r for r in self.streams if r.ok]
        long_ok = [r for r in self.long if r.ok]
        itl_p50 = percentile([g for r in ok for g in r.gaps], 50)
        window = self.window_gaps()
        gap_max = max(window, default=None)
        ttfts = [t for r in long_ok if (t := r.ttft) is not None]
        prompts = [float(r.prompt_tokens) for r in long_ok if r.prompt_tokens is not None]
        return {
            "streams": self.config.streams,
            "long_requests": self.config.requests,
            "long_prompt_tokens_target": self.config.prompt_tokens,
            "long_prompt_tokens_mean": mean(prompts),
            "stream_errors": len(self.streams) - len(ok),
            "long_errors": len(self.long) - len(long_ok),
            "tokens_at_arrival_min": min(self.tokens_at_arrival, default=None),
            "arrival_s": self.arrival,
            "window_ms": ms(self.window_end - self.arrival),
            "streams_through_window": sum(
                1 for r in ok if r.end is not None and r.end >= self.window_end
            ),
            "stream_itl_p50_ms": ms(itl_p50),
            "window_gap_p99_ms": ms(percentile(window, 99)),
            "window_gap_max_ms": ms(gap_max),
            "gap_max_over_itl_p50": None if gap_max is None or not itl_p50 else gap_max / itl_p50,
            "long_ttft_p50_ms": ms(percentile(ttfts, 50)),
            "long_ttft_max_ms": ms(max(ttfts, default=None)),
            "wall_s": self.wall_s,
            "attempt": self.attempt,
            **self.cpu,
        }


def run_long(
    kind: Kind,
    base_url: str,
    model: str,
    stream_prompts: Sequence[str],
    long_prompts: Sequence[str],
    config: LongConfig,
    timeout: float,
    server_pid: int | None = None,
) -> LongResult:
    """Start the streams at once, send the long requests together once every stream has
    MIN_TOKENS text deltas (or ended), and wait for all of them."""
    client = make_client(base_url, timeout)
    s, k = len(stream_prompts), len(long_prompts)
    streams = [RequestResult(index=i, start=0.0) for i in range(s)]
    long = [RequestResult(index=s + i, start=0.0) for i in range(k)]
    go_streams, go_long = threading.Barrier(s + 1), threading.Barrier(k + 1)
    origin_box: list[float] = []

    def worker(barrier: threading.Barrier, r: RequestResult, prompt: str, limit: int) -> None:
        barrier.wait()
        origin = origin_box[0]
        r.start = time.perf_counter() - origin
        run_request(STREAMERS[kind], client, model, prompt, limit, r, origin, origin + timeout)

    jobs = [
        (go_streams, r, p, config.stream_tokens)
        for r, p in zip(streams, stream_prompts, strict=True)
    ]
    jobs += [(go_long, r, p, LONG_OUTPUT_TOKENS) for r, p in zip(long, long_prompts, strict=True)]
    threads = [threading.Thread(target=worker, args=job, daemon=True) for job in jobs]
    for t in threads:
        t.start()
    cpu_before = CpuSample.take(server_pid)
    origin_box.append(time.perf_counter())
    origin = origin_box[0]
    go_streams.wait()
    while time.perf_counter() < origin + timeout and not all(
        r.deltas >= MIN_TOKENS or r.end is not None for r in streams
    ):
        time.sleep(0.01)
    tokens_at_arrival = [r.deltas for r in streams]
    arrival = time.perf_counter() - origin
    go_long.wait()
    join_all(threads, [*streams, *long], origin, origin + timeout)
    wall = max((r.end or 0.0) for r in [*streams, *long])
    cpu = cpu_shares(cpu_before, CpuSample.take(server_pid), time.perf_counter() - origin)
    client.close()
    return LongResult(config, streams, long, arrival, tokens_at_arrival, wall, cpu)


def _raw(r: RequestResult) -> dict[str, Any]:
    return asdict(r) | {"ttft": r.ttft, "tpot": r.tpot, "tokens_per_s": r.tokens_per_s}


def print_long_attempt(
    label: str, config: LongConfig, result: LongResult, s: dict[str, Any]
) -> None:
    """One run's headline, its failed requests, and a note when streams ended too soon."""
    print(
        f"[{label}] long prompts: {s['wall_s']:.1f}s, largest gap "
        f"{fmt(s['window_gap_max_ms'], '{:.0f}')} ms, long TTFT max "
        f"{fmt(s['long_ttft_max_ms'], '{:.0f}')} ms, {s['stream_errors']}+"
        f"{s['long_errors']} errors; other processes "
        f"{fmt(s['other_cpu_pct'], '{:.0f}')}% CPU",
        flush=True,
    )
    for r in [*result.streams, *result.long]:
        if r.error is not None:
            print(f"[{label}]   request {r.index}: {json.dumps(r.error)[:600]}", flush=True)
    if s["streams_through_window"] < config.streams - s["stream_errors"]:
        print(
            f"[{label}]   note: only {s['streams_through_window']} streams were still "
            "decoding when the last long request's first token came; raise "
            "--long-stream-tokens",
            flush=True,
        )


def bench_long(
    server: Server,
    config: LongConfig,
    timeout: float,
    prompts: Callable[[int], tuple[list[str], list[str]]],
    wait_idle: float = 0.0,
    busy_retries: int = 0,
) -> dict[str, Any]:
    """Run the level against one server, re-running it (with fresh prompts) up to
    `busy_retries` times when other processes disturbed it; the least disturbed run
    stands. `prompts(attempt)` gives the streams' and the long requests' prompts."""
    label = LABELS[server.kind]
    pid = server.proc.pid if server.proc is not None else None
    attempts: list[LongResult] = []
    for attempt in range(1, busy_retries + 2):
        if wait_idle > 0:
            wait_for_idle(wait_idle)
        print(
            f"[{label}] long prompts: {config.streams} streams x {config.stream_tokens} tokens, "
            f"then {config.requests} x ~{config.prompt_tokens}-token prompts ...",
            flush=True,
        )
        stream_prompts, long_prompts = prompts(attempt)
        result = run_long(
            server.kind,
            server.base_url,
            server.model,
            stream_prompts,
            long_prompts,
            config,
            timeout,
            pid,
        )
        result.attempt = attempt
        attempts.append(result)
        s = result.summary()
        print_long_attempt(label, config, result, s)
        time.sleep(1.0)
        other = s["other_cpu_pct"]
        if other is None or other <= OTHER_CPU_WARN_PCT or attempt > busy_retries:
            break
        print(f"[{label}]   other processes used {other:.0f}% of the CPU; re-running", flush=True)
    best = min(attempts, key=lambda r: r.cpu.get("other_cpu_pct") or 0.0)
    summary = best.summary()
    return {
        "command": server.command,
        "blas": server.blas_line(),
        "summary": summary,
        "all_attempts": [r.summary() for r in attempts],
        "window_s": [best.arrival, best.window_end],
        "tokens_at_arrival": best.tokens_at_arrival,
        "streams": [_raw(r) for r in best.streams],
        "long_requests": [_raw(r) for r in best.long],
        "log_tail": server.log_tail()
        if summary["stream_errors"] + summary["long_errors"]
        else None,
    }


COLUMNS = (
    ("S", "streams", "{:d}"),
    ("K", "long_requests", "{:d}"),
    ("prompt tok", "long_prompt_tokens_mean", "{:.0f}"),
    ("ITL p50 ms", "stream_itl_p50_ms", "{:.1f}"),
    ("window gap p99 ms", "window_gap_p99_ms", "{:.0f}"),
    ("window gap max ms", "window_gap_max_ms", "{:.0f}"),
    ("max gap / ITL p50", "gap_max_over_itl_p50", "{:.1f}"),
    ("long TTFT p50 ms", "long_ttft_p50_ms", "{:.0f}"),
    ("long TTFT max ms", "long_ttft_max_ms", "{:.0f}"),
    ("window ms", "window_ms", "{:.0f}"),
    ("streams through", "streams_through_window", "{:d}"),
    ("errors", "errors", "{}"),
)


def long_table(summaries: dict[str, dict[str, Any]]) -> str:
    """One row per server: label -> summary."""
    rows = []
    for label, s in summaries.items():
        values = s | {"errors": f"{s['stream_errors']}+{s['long_errors']}"}
        rows.append([label, *(fmt(values[key], spec) for _, key, spec in COLUMNS)])
    return markdown_table(["server", *(h for h, _, _ in COLUMNS)], rows)


RATIO_KEYS = (
    ("ITL p50", "stream_itl_p50_ms"),
    ("window gap p99", "window_gap_p99_ms"),
    ("window gap max", "window_gap_max_ms"),
    ("max gap / ITL p50", "gap_max_over_itl_p50"),
    ("long TTFT p50", "long_ttft_p50_ms"),
    ("long TTFT max", "long_ttft_max_ms"),
)


def long_ratios(ours: dict[str, Any], peer: dict[str, Any]) -> dict[str, float | None]:
    return {
        key: None if ours[key] is None or not peer[key] else ours[key] / peer[key]
        for _, key in RATIO_KEYS
    }


def long_ratio_table(r: dict[str, float | None]) -> str:
    headers = [f"{h} ours/peer" for h, _ in RATIO_KEYS]
    return markdown_table(headers, [[fmt(r[key], "{:.2f}") for _, key in RATIO_KEYS]])


def print_long(
    config: LongConfig, servers: dict[str, Any], ratios: dict[str, float | None] | None
) -> None:
    """The level's table (one row per server that ran it) and the ours/peer ratios."""
    rows = {s["label"]: s["long"]["summary"] for s in servers.values() if "long" in s}
    if not rows:
        return
    print(
        f"\nlong prompts: {config.requests} x ~{config.prompt_tokens} tokens arriving while "
        f"{config.streams} streams decode ({config.stream_tokens} tokens each), parallel "
        f"{config.parallel}; gaps are the running streams' times between two text deltas\n"
    )
    print(long_table(rows))
    if ratios is not None:
        print("\nlong prompts, ratios (ours / peer): below 1 favours mlxcel\n")
        print(long_ratio_table(ratios))
