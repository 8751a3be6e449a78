"""llama.cpp as a second peer: its own C++ `llama-server` on the default model's own GGUF
(Q4_K_M), read through Chat Completions like mlx_lm.server.

The binary is built once by `bench/llama_server.py build` (llama.cpp as vendored by the
pinned llama-cpp-python release, for this CPU's instruction sets) and found in the cache.

How it takes concurrent requests: `-np P` slots with continuous batching, the same P as
our `--parallel` (the largest level unless `--parallel` says otherwise), so at every level
each request has a slot, as on ours, and one model load serves the sweep. The slots share
one unified KV cache (`-kvu`), so an idle slot holds no memory and one long prompt may use
the whole context; the context (`-c`) holds P prompts with their output at once, and the
longest single prompt. Threads (`-t`, `-tb`: decode and prompt reading) are those of the
MLX servers' OpenBLAS (one per usable core, or `OPENBLAS_NUM_THREADS`). Everything else is
llama-server's default, including its prompt cache (each slot reuses the longest prefix it
holds). Its streams carry usage when asked (`stream_options.include_usage`), as the other
servers' do.
"""

from __future__ import annotations

import os
from pathlib import Path

import llama_server

LLAMACPP_MODEL = "bench"
"""The alias the server lists and requests name."""
HEALTH_PATH = "/health"
"""503 while the model loads, 200 once requests are served."""
MIN_CTX = 4096
SLOT_PROMPT_TOKENS = 256
"""Room for one level prompt with its chat template (123 tokens for the default model)."""
LONG_PROMPT_ROOM = 1024
"""Room past the longest prompt's content: its chat template and output."""


def installed() -> bool:
    """True when `bench/llama_server.py build` has built llama-server for this CPU."""
    return llama_server.cached_build() is not None


def binary() -> tuple[Path, dict[str, object]]:
    """The built binary and its build record; a llama_server.BuildError when not built."""
    found = llama_server.cached_build()
    if found is None:
        raise llama_server.BuildError(NOT_BUILT)
    return found


NOT_BUILT = (
    "llama-server is not built for this CPU: run `.venv/bin/python bench/llama_server.py "
    "build` once (minutes), or leave llamacpp out of --only"
)


def threads() -> int:
    """The threads the MLX servers' OpenBLAS uses: OPENBLAS_NUM_THREADS, else the cores."""
    configured = os.environ.get("OPENBLAS_NUM_THREADS", "")
    if configured.isdigit() and int(configured) > 0:
        return int(configured)
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def context_size(
    long_prompt_tokens: int | None, streams: int, stream_tokens: int, long_requests: int = 0
) -> int:
    """Tokens the shared KV cache must hold: `streams` level prompts with `stream_tokens`
    of output each, plus `long_requests` long prompts, all at once; and never less than
    the longest prompt alone with its room, or MIN_CTX."""
    long_room = (long_prompt_tokens or 0) + LONG_PROMPT_ROOM
    together = streams * (SLOT_PROMPT_TOKENS + stream_tokens) + long_requests * long_room
    return max(MIN_CTX, long_room, together)


def llamacpp_command(
    program: Path, gguf: Path, port: int, n_threads: int, n_ctx: int, parallel: int
) -> list[str]:
    return [
        str(program),
        "--model",
        str(gguf),
        "--alias",
        LLAMACPP_MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--threads",
        str(n_threads),
        "--threads-batch",
        str(n_threads),
        "--ctx-size",
        str(n_ctx),
        "--parallel",
        str(parallel),
        "--kv-unified",
    ]


def build_record() -> dict[str, object] | None:
    """What the report keeps of the build: the binary, the release, its flags (None when
    llama-server is not built)."""
    found = llama_server.cached_build()
    return None if found is None else {"binary": str(found[0]), **found[1]}
