"""llama.cpp as a second peer: llama-cpp-python's OpenAI-compatible server on the default
model's own GGUF (Q4_K_M), read through Chat Completions like mlx_lm.server.

How it takes concurrent requests (llama-cpp-python 0.3.x, `llama_cpp/server/app.py`):
one `Llama` object serves every request behind two `anyio.Lock`s (`llama_outer_lock`,
`llama_inner_lock`), so requests run one at a time, each to its end, with no batching
across requests; the others wait for the lock. By default (`interrupt_requests=True`) a
streaming request is cut short, with a bare `[DONE]` and no finish reason, as soon as
another request waits for the lock; the benchmark turns that off so that requests queue
instead of failing. Between requests it reuses the longest prefix the new prompt shares
with the previous one (its single KV sequence), which plays the role of a prompt cache.

The server is started with as many threads as the other servers' BLAS uses (one per
usable core, or `OPENBLAS_NUM_THREADS`), for decoding and prompt reading alike, and
with `logits_all` off: it computes logits for the last position only, as the MLX
servers do (the server's default computes them for every prompt token, which only
logprobs need). Its streamed chunks carry no usage, so output tokens are counted as
text deltas (one per token).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

LLAMACPP_MODEL = "bench"
"""The alias the server lists and requests name."""
HEALTH_PATH = "/v1/models"
"""llama-cpp-python has no /health; it listens only once the model is loaded."""
MIN_CTX = 4096


def installed() -> bool:
    """True when llama-cpp-python and its server extra are importable here."""
    return all(importlib.util.find_spec(m) is not None for m in ("llama_cpp", "sse_starlette"))


def threads() -> int:
    """The threads the MLX servers' OpenBLAS uses: OPENBLAS_NUM_THREADS, else the cores."""
    configured = os.environ.get("OPENBLAS_NUM_THREADS", "")
    if configured.isdigit() and int(configured) > 0:
        return int(configured)
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def context_size(long_prompt_tokens: int | None) -> int:
    """Room for the longest prompt the run sends plus its chat template and output."""
    return max(MIN_CTX, (long_prompt_tokens or 0) + 1024)


def llamacpp_command(gguf: Path, port: int, n_threads: int, n_ctx: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(gguf),
        "--model_alias",
        LLAMACPP_MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_threads",
        str(n_threads),
        "--n_threads_batch",
        str(n_threads),
        "--n_ctx",
        str(n_ctx),
        "--logits_all",
        "False",
        "--interrupt_requests",
        "False",
    ]
