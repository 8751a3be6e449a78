"""Time to first token of a long prompt: cold, warm (the prompt cache in memory) and after
a restart (the prompt cache's disk tier).

For each prompt size, our server is started with a fresh `--prompt-cache-dir`; the
prompt is sent once (cold: the whole prompt is read), once more (warm: all but its last
token come from memory), the server is stopped (SIGINT: it drains and writes its cache),
started again, and the prompt is sent a third time (after a restart: read back from its
file). Each request streams from the Responses API, greedy, a few output tokens; TTFT is
from sending to the first text delta. Prints a table; asserts nothing.

    .venv/bin/python bench/warm_cold.py [--model DIR] [--sizes 2000 8600] [--trials 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import openai
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseIncompleteEvent,
    ResponseTextDeltaEvent,
)
from prompts import TokenCounter, make_long_prompt
from servers import (
    OUR_ALIAS,
    Server,
    free_port,
    handle_stop_signals,
    our_command,
    start_server,
    stop_server,
)

PHASES = ("cold", "warm", "restart")


@dataclass
class Figures:
    """One prompt size's measurements, by phase: TTFT seconds and cached tokens."""

    tokens: int = 0
    ttft: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})
    cached: dict[str, list[int]] = field(default_factory=lambda: {p: [] for p in PHASES})
    restart_secs: list[float] = field(default_factory=list)
    """From the restart's launch to its answering /health (the model load)."""


def first_token(url: str, prompt: str, timeout: float) -> tuple[float, int, int]:
    """Seconds to the first text delta, the prompt's tokens and its cached tokens."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=timeout, max_retries=0)
    started = time.perf_counter()
    first: float | None = None
    tokens = cached = 0
    with client.responses.create(
        model=OUR_ALIAS, input=prompt, max_output_tokens=8, temperature=0, stream=True
    ) as stream:
        for event in stream:
            if isinstance(event, ResponseTextDeltaEvent) and event.delta and first is None:
                first = time.perf_counter() - started
            ended = isinstance(event, ResponseCompletedEvent | ResponseIncompleteEvent)
            if ended and event.response.usage is not None:
                tokens = event.response.usage.input_tokens
                cached = event.response.usage.input_tokens_details.cached_tokens
    client.close()
    if first is None:
        raise RuntimeError("the stream ended without text")
    return first, tokens, cached


def launch(model: Path, cache: Path, logs: Path, timeout: float) -> Server:
    port = free_port()
    command = [*our_command(model, port, 1), "--prompt-cache-dir", str(cache)]
    return start_server("ours", command, port, OUR_ALIAS, logs / f"server-{port}.log", timeout)


def measure(model: Path, prompt: str, work: Path, figures: Figures, timeout: float) -> None:
    """One trial of a prompt: cold and warm on one server, then after its restart."""
    cache = Path(tempfile.mkdtemp(prefix="prompt-cache-", dir=work))
    server = launch(model, cache, work, timeout)
    try:
        for phase in PHASES[:2]:
            secs, figures.tokens, hit = first_token(server.base_url, prompt, timeout)
            figures.ttft[phase].append(secs)
            figures.cached[phase].append(hit)
    finally:
        stop_server(server)
    started = time.perf_counter()
    server = launch(model, cache, work, timeout)
    figures.restart_secs.append(time.perf_counter() - started)
    try:
        secs, _, hit = first_token(server.base_url, prompt, timeout)
        figures.ttft["restart"].append(secs)
        figures.cached["restart"].append(hit)
    finally:
        stop_server(server)


def print_table(results: dict[int, Figures]) -> None:
    print()
    print("| prompt tokens | TTFT cold | TTFT warm (memory) | TTFT after restart (disk) |")
    print("|---:|---:|---:|---:|")
    for fig in results.values():
        cells = []
        for phase in PHASES:
            secs = statistics.median(fig.ttft[phase])
            cells.append(f"{secs:.2f} s ({min(fig.cached[phase])} cached)")
        print(f"| {fig.tokens:,} | " + " | ".join(cells) + " |")
    for fig in results.values():
        load = statistics.median(fig.restart_secs)
        cold, disk = (statistics.median(fig.ttft[p]) for p in ("cold", "restart"))
        print(
            f"{fig.tokens:,} tokens: restart (model load and warm-up) {load:.1f} s; "
            f"first token {cold / disk:.1f}x sooner from disk than cold"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="MLX model folder")
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 8600])
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per request")
    args = parser.parse_args()
    model = args.model
    if model is None:
        from mlxcel.model.provision.fetch import default_model_dir, is_ready

        model = default_model_dir()
        if not is_ready(model):
            print("run `mlxcel fetch-model` first, or pass --model", file=sys.stderr)
            return 2
    handle_stop_signals()
    counter = TokenCounter(model)
    results: dict[int, Figures] = {}
    with tempfile.TemporaryDirectory(prefix="warm-cold-") as work:
        for size in args.sizes:
            figures = results.setdefault(size, Figures())
            for trial in range(args.trials):
                prompt = make_long_prompt(f"warm-cold-{size}-{trial}", counter, size)
                measure(model, prompt, Path(work), figures, args.timeout)
                cells = ", ".join(f"{p} {figures.ttft[p][-1]:.2f} s" for p in PHASES)
                print(f"{figures.tokens:,} prompt tokens, trial {trial + 1}: {cells}", flush=True)
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
