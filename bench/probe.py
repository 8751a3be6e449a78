"""Single requests alone on a server: its decode rate and its prompt-reading rate.

Before the levels, every server gets the very same requests, through Chat Completions
(ours included), one at a time with nothing else running:

- *decode*: "Write a haiku." with the `--max-tokens` budget at `--temperature` (0), repeated
  `--probe-repeats` times; a request's decode rate is `(output tokens - 1) / (end -
  first text delta)`, i.e. 1 / TPOT, and the median over the repeats is kept;
- *read*: the long-prompt level's own kind of ~T-token prompt (`--long-prompt-tokens`),
  each repeat a different one (so no prompt cache shortens it), with a 16-token budget; its
  read rate is the prompt's tokens (counted with the model's tokenizer, content only,
  the same number for every server) over its time to first token, median over repeats.
  TTFT also holds one decode step and the HTTP round trip, so this slightly understates
  the prefill rate, equally for every server.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from clients import RequestResult, make_client, run_request, stream_peer
from load import CpuSample, cpu_shares
from report import LABELS, fmt, markdown_table, ms
from servers import Server

HAIKU = "Write a haiku."
READ_OUTPUT_TOKENS = 16


def one_request(server: Server, prompt: str, max_tokens: int, timeout: float) -> RequestResult:
    """One streamed Chat Completions request, alone, at temperature 0."""
    client = make_client(server.base_url, timeout)
    origin = time.perf_counter()
    result = RequestResult(index=0, start=0.0)
    try:
        run_request(
            stream_peer, client, server.model, prompt, max_tokens, result, origin, origin + timeout
        )
    finally:
        client.close()
    return result


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _raw(r: RequestResult) -> dict[str, Any]:
    return asdict(r) | {"ttft": r.ttft, "tpot": r.tpot}


def probe_server(
    server: Server,
    max_tokens: int,
    repeats: int,
    read_prompts: Sequence[str],
    read_tokens: int,
    timeout: float,
) -> dict[str, Any]:
    """Run the decode repeats, then the read prompts, one request at a time."""
    label = LABELS[server.kind]
    pid = server.proc.pid if server.proc is not None else None
    print(
        f"[{label}] single requests: {repeats} x haiku ({max_tokens} tokens), "
        f"{len(read_prompts)} x ~{read_tokens}-token prompt ...",
        flush=True,
    )
    before, t0 = CpuSample.take(pid), time.perf_counter()
    haiku = [one_request(server, HAIKU, max_tokens, timeout) for _ in range(repeats)]
    reads = [one_request(server, p, READ_OUTPUT_TOKENS, timeout) for p in read_prompts]
    cpu = cpu_shares(before, CpuSample.take(pid), time.perf_counter() - t0)
    ok_haiku = [r for r in haiku if r.ok]
    ok_reads = [r for r in reads if r.ok]
    reported = [r.prompt_tokens for r in ok_reads if r.prompt_tokens is not None]
    summary = {
        "decode_tok_s": _median([1.0 / t if (t := r.tpot) else None for r in ok_haiku]),
        "haiku_output_tokens": _median([float(r.output_tokens) for r in ok_haiku]),
        "haiku_ttft_ms": ms(_median([r.ttft for r in ok_haiku])),
        "read_prompt_tokens": read_tokens if read_prompts else None,
        "read_prompt_tokens_reported": statistics.mean(reported) if reported else None,
        "read_ttft_ms": ms(_median([r.ttft for r in ok_reads])),
        "read_tok_s": _median([read_tokens / t if (t := r.ttft) else None for r in ok_reads]),
        "errors": len(haiku) + len(reads) - len(ok_haiku) - len(ok_reads),
        **cpu,
    }
    print(
        f"[{label}] decode {fmt(summary['decode_tok_s'], '{:.1f}')} tok/s, read "
        f"{fmt(summary['read_tok_s'], '{:.0f}')} tok/s, {summary['errors']} errors; other "
        f"processes {fmt(summary['other_cpu_pct'], '{:.0f}')}% CPU",
        flush=True,
    )
    for r in [*haiku, *reads]:
        if r.error is not None:
            print(f"[{label}]   request: {r.error}", flush=True)
    return {
        "summary": summary,
        "haiku": [_raw(r) for r in haiku],
        "reads": [_raw(r) for r in reads],
    }


COLUMNS = (
    ("decode tok/s", "decode_tok_s", "{:.1f}"),
    ("haiku tokens", "haiku_output_tokens", "{:.0f}"),
    ("haiku TTFT ms", "haiku_ttft_ms", "{:.0f}"),
    ("read prompt tok", "read_prompt_tokens", "{:d}"),
    ("read TTFT ms", "read_ttft_ms", "{:.0f}"),
    ("read tok/s", "read_tok_s", "{:.0f}"),
    ("other CPU %", "other_cpu_pct", "{:.0f}"),
    ("errors", "errors", "{:d}"),
)


def probe_table(servers: dict[str, Any]) -> str | None:
    """One row per server that ran the single requests; None when none did."""
    rows = [
        [s["label"], *(fmt(s["probe"]["summary"][key], spec) for _, key, spec in COLUMNS)]
        for s in servers.values()
        if "probe" in s
    ]
    if not rows:
        return None
    return markdown_table(["server", *(h for h, _, _ in COLUMNS)], rows)
