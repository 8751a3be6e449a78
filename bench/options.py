"""The serving benchmark's command line (bench/serve.py): what is benched and how a run
goes, and which servers and model folder it names."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import get_args

import llamacpp
from clients import Kind
from load import OTHER_CPU_WARN_PCT
from long_prompt import add_options

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
DEFAULT_LEVELS = (1, 4, 16, 64)
DEFAULT_PROBE_REPEATS = 3
KINDS: tuple[Kind, ...] = get_args(Kind)


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--levels {text!r}: comma-separated integers") from exc
    if any(n < 1 for n in levels):
        raise argparse.ArgumentTypeError("--levels needs positive integers, e.g. 1,4,16,64")
    return levels


def parse_kinds(text: str) -> list[Kind]:
    """`ours,llamacpp` -> the servers to bench, in the order they run (as KINDS)."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [n for n in names if n not in KINDS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"--only {text!r}: a comma-separated choice of {', '.join(KINDS)}"
        )
    return [k for k in KINDS if k in names]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench/serve.py",
        description="Streaming latency/throughput benchmark: mlxcel-server against "
        "mlx_lm.server and llama.cpp.",
    )
    add_target_options(p)
    add_peer_options(p)
    add_run_options(p)
    add_options(p)
    return p


def add_target_options(p: argparse.ArgumentParser) -> None:
    """What is benched: the model, the servers, the concurrency levels and the slots."""
    p.add_argument(
        "--model",
        type=Path,
        default=None,
        help="MLX model folder ours and mlx_lm.server load (default: the embedded default model)",
    )
    p.add_argument(
        "--peer-model",
        type=Path,
        default=None,
        help="MLX folder mlx_lm.server loads instead (default without --model: the default "
        "model's float32 folder, `mlxcel fetch-model --precision float32`, when present)",
    )
    p.add_argument(
        "--levels",
        type=parse_levels,
        default=list(DEFAULT_LEVELS),
        help="comma-separated concurrency levels (default: 1,4,16,64; '' for none)",
    )
    p.add_argument(
        "--max-tokens", type=int, default=64, help="max output tokens per request (default: 64)"
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="every request's temperature, on every server (default: 0, greedy)",
    )
    p.add_argument(
        "--top-p",
        type=float,
        default=1.0,
        help="every request's top_p, on every server (default: 1, off)",
    )
    p.add_argument(
        "--only",
        type=parse_kinds,
        default=None,
        help="bench only these servers, comma-separated: ours, peer (mlx_lm.server), "
        "llamacpp (default: ours and peer, and llamacpp when llama-server is built: "
        "bench/llama_server.py build)",
    )
    p.add_argument(
        "--parallel",
        type=int,
        default=None,
        help="our --parallel and the peer's --decode-concurrency (default: the largest level)",
    )
    p.add_argument(
        "--probe-repeats",
        type=int,
        default=DEFAULT_PROBE_REPEATS,
        help="single requests alone on each server before the levels: the haiku decode "
        "request and a --long-prompt-tokens prompt, this many times each "
        f"(default: {DEFAULT_PROBE_REPEATS}; 0 skips them)",
    )


def add_peer_options(p: argparse.ArgumentParser) -> None:
    """Servers already running, and the peers' own settings."""
    p.add_argument(
        "--our-url", default=None, help="bench an already running mlxcel server at this base URL"
    )
    p.add_argument(
        "--peer-url", default=None, help="bench an already running mlx_lm.server at this base URL"
    )
    p.add_argument(
        "--llamacpp-url",
        default=None,
        help="bench an already running llama.cpp server (llama-server) at this base URL",
    )
    p.add_argument(
        "--prompt-concurrency",
        type=int,
        default=None,
        help="the peer's --prompt-concurrency (default: min(parallel, 8), "
        "matching our prefill batch)",
    )
    p.add_argument(
        "--gguf",
        type=Path,
        default=None,
        help="GGUF file llama.cpp serves (default: the default model's own Q4_K_M GGUF, "
        "assembled once into the user cache)",
    )


def add_run_options(p: argparse.ArgumentParser) -> None:
    """How a run goes: its time limits, waiting out busy CPUs, and where results go."""
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


def peer_model_dir_from(args: argparse.Namespace) -> Path | None:
    """mlx_lm.server's folder: --peer-model; else, on the default model, its float32 folder.

    MLX's own CPU quantized matmul is scalar, so mlx_lm.server is fastest on float32
    weights through the fast BLAS; comparing against its slowest configuration would
    flatter us. None: the same folder as ours.
    """
    if args.peer_model:
        return Path(args.peer_model).expanduser().resolve()
    if args.model:
        return None
    try:
        fetch = importlib.import_module("mlxcel.model.provision.fetch")
    except ImportError:
        return None
    folder = Path(fetch.model_dir(fetch.DEFAULT_MODEL.at("float32")))
    return folder if (folder / "config.json").is_file() else None


class UsageError(Exception):
    """A command line that cannot run: its message is printed and the exit status is 2."""


def default_model_dir() -> Path | None:
    try:
        fetch = importlib.import_module("mlxcel.model.provision.fetch")
    except ImportError:
        return None
    return Path(fetch.default_model_dir())


def kinds_from(args: argparse.Namespace) -> list[Kind]:
    """--only, else ours and mlx_lm.server, and llama.cpp when llama-server is built or it
    is asked for (--llamacpp-url, --gguf); a UsageError when llama.cpp cannot be started."""
    asked = bool(args.llamacpp_url or args.gguf)
    kinds: list[Kind] = args.only or [
        "ours",
        "peer",
        *(["llamacpp"] if asked or llamacpp.installed() else []),
    ]
    if "llamacpp" in kinds and not args.llamacpp_url:
        if not llamacpp.installed():
            raise UsageError(llamacpp.NOT_BUILT)
        if args.gguf and not args.gguf.expanduser().is_file():
            raise UsageError(f"--gguf {args.gguf}: no such file")
    return kinds


def model_dir_from(args: argparse.Namespace, kinds: list[Kind]) -> Path | None:
    """The model folder: --model or the default one; it must be an MLX model folder when
    this run starts a server."""
    model_dir: Path | None = args.model.expanduser().resolve() if args.model else None
    needs_folder = ("ours" in kinds and not args.our_url) or ("peer" in kinds and not args.peer_url)
    if model_dir is None:
        model_dir = default_model_dir()
        if needs_folder and model_dir is None:
            raise UsageError("no --model given and the default model location is unknown")
    if needs_folder:
        assert model_dir is not None
        if not (model_dir / "config.json").is_file():
            raise UsageError(
                f"{model_dir} is not an MLX model folder (no config.json); run "
                "`mlxcel fetch-model` or pass --model"
            )
    return model_dir
