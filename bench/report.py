"""Numbers and presentation: percentiles, level summaries, ours/peer ratios, Markdown
tables, PNG plots and a description of the machine (its CPU, what our kernels use of it
and how llama-server was built for it)."""

from __future__ import annotations

import contextlib
import importlib
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llama_server import amx_granted

if TYPE_CHECKING:
    from clients import RequestResult

LABELS = {"ours": "mlxcel", "peer": "mlx_lm.server", "llamacpp": "llama.cpp"}
"""How tables, plots and progress lines name each kind of server."""


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
            "ttft_p50_ms": ms(percentile(ttfts, 50)),
            "ttft_p99_ms": ms(percentile(ttfts, 99)),
            "itl_p50_ms": ms(percentile(gaps, 50)),
            "itl_p99_ms": ms(percentile(gaps, 99)),
            "tpot_mean_ms": ms(mean(tpots)),
            "agg_tok_s": tokens / self.wall_s if self.wall_s > 0 else None,
            "req_tok_s_mean": mean(rates),
            "attempt": self.attempt,
            **self.cpu,
        }


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


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


def fmt(value: Any, spec: str) -> str:
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
    rows = [[fmt(s[key], spec) for _, key, spec in COLUMNS] for s in summaries]
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


def ratio_table(rows: Sequence[dict[str, Any]], peer: str = "peer") -> str:
    headers = ["N", *(f"{h} ours/{peer}" for h in ("agg tok/s", "TTFT p50", "TTFT p99"))]
    body = [
        [
            str(r["n"]),
            fmt(r["agg_tok_s"], "{:.2f}"),
            fmt(r["ttft_p50"], "{:.2f}"),
            fmt(r["ttft_p99"], "{:.2f}"),
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
            label = LABELS[kind]
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
        "our_kernels": our_kernels(),
    }


def our_kernels() -> dict[str, Any]:
    """The CPU kernels our server builds here, and whether their AMX path runs: the kernels'
    build (MLXCEL_CPU_ISA, else the CPU's widest; None for MLX's own operations) and, for
    the AVX-512 build on a CPU with VBMI and AMX, MLXCEL_QMM_AMX not 0 and the OS's grant
    of the tile state (the quantized matmul's own checks; it then multiplies 5 rows and
    more on the tiles). Worked out in this process, with the environment the started
    server inherits; a server given by --our-url may have been started otherwise."""
    build = importlib.import_module("mlxcel.model.native.build")
    cpu = build.probe()
    isa = build.kernels_isa(cpu)
    granted = amx_granted()
    reasons = (
        (not cpu.amx, "the CPU has no AMX with VBMI"),
        (isa != "avx512", f"the kernels' build is {isa or 'off'}"),
        (os.environ.get("MLXCEL_QMM_AMX") == "0", "MLXCEL_QMM_AMX=0"),
        (not granted, "the OS does not grant the tile state"),
    )
    why_not = next((why for no, why in reasons if no), None)
    return {
        "cpu": cpu.describe(),
        "isa": isa,
        "amx": why_not is None,
        "no_amx_because": why_not,
        "amx_granted": granted,
        "env": {k: os.environ.get(k) for k in ("MLXCEL_CPU_ISA", "MLXCEL_QMM_AMX")},
    }


def hardware_line(report: dict[str, Any]) -> str:
    """One line for the console: the CPU, our kernels and AMX, llama-server's build."""
    box = report["machine"]
    kernels = box["our_kernels"]
    ours = f"{kernels['isa']} kernels" if kernels["isa"] else "MLX's own operations"
    amx = "AMX used" if kernels["amx"] else f"no AMX: {kernels['no_amx_because']}"
    line = f"CPU: {box['cpu']}; ours: {ours}, {amx}"
    build = report.get("llamacpp", {}).get("build")
    if isinstance(build, dict):
        line += f"; llama-server ({build['llama_cpp_python']}): {build['flags']}"
    elif build == "external":
        line += "; llama-server: an external server, its build unknown"
    return line
