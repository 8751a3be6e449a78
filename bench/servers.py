"""The servers under test as subprocesses: mlxcel-server, mlx_lm.server and llama.cpp's
llama-server on free local ports, each in its own session, health-checked and warmed up before
use, always stopped."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from clients import STREAMERS, Kind, RequestResult, make_client, run_request
from llamacpp import LLAMACPP_MODEL, llamacpp_command, threads

OUR_ALIAS = "bench"
PEER_MODEL = "default_model"  # mlx_lm.server's name for the folder given by --model
LOG_TAIL_LINES = 40
MODEL_NAMES: dict[Kind, str] = {"ours": OUR_ALIAS, "peer": PEER_MODEL, "llamacpp": LLAMACPP_MODEL}

# The peer runs under the same BLAS routing as our server: `load_fast_blas()` before
# anything imports mlx.core, then mlx_lm.server's own `main()`.
PEER_BOOT = """\
import sys
from mlxcel.model.native.blas import describe, load_fast_blas
info = load_fast_blas()
print(describe(info), flush=True)
model, port, decode, prompt = sys.argv[1:5]
sys.argv = ["mlx_lm.server", "--model", model, "--host", "127.0.0.1", "--port", port,
            "--decode-concurrency", decode, "--prompt-concurrency", prompt]
from mlx_lm.server import main
main()
"""


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
    kind: Kind,
    command: list[str],
    port: int,
    model: str | None,
    log_path: Path,
    startup_timeout: float,
) -> Server:
    """Start `command` logging to `log_path` and wait until it is healthy and warm.

    `model` is the name requests use; None asks the started server for the first model
    it lists.
    """
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
    server = Server(kind, f"http://127.0.0.1:{port}", model or "", command, proc, log_path)
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
    An empty `server.model` is filled in with the first model the server lists. A server
    without /health (404: llama-cpp-python's, given by --llamacpp-url) is polled on
    /v1/models instead, which it serves once its model is loaded.
    """
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    health = "/health"
    with httpx.Client(timeout=5.0) as http:
        while True:
            _check_alive(server)
            try:
                reply = http.get(server.base_url + health)
                if reply.status_code == 200:
                    break
                if reply.status_code == 404 and health == "/health":
                    health = "/v1/models"
                last = f"HTTP {reply.status_code}: {reply.text[:200]}"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"{server.kind} server not healthy after {timeout:.0f}s ({last}); "
                    f"log tail:\n{server.log_tail()}"
                )
            time.sleep(0.5)
    if not server.model:
        server.model = our_model_name(server.base_url)
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
        hint = ""
        if server.kind == "llamacpp" and code in (-signal.SIGILL, -signal.SIGSEGV):
            hint = (
                " (a llama-server built with --amx? `bench/llama_server.py build` makes "
                "the default build the one that runs again)"
            )
        raise ServerStartError(
            f"{server.kind} server exited with code {code} during start-up{hint}; "
            f"log tail:\n{server.log_tail()}"
        )


@dataclass(frozen=True)
class Launch:
    """What a started server serves and with how many slots."""

    model_dir: Path | None
    """The MLX folder ours and mlx_lm.server load."""
    parallel: int
    """Our --parallel and mlx_lm.server's --decode-concurrency."""
    prompt_concurrency: int
    """mlx_lm.server's --prompt-concurrency."""
    gguf: Path | None = None
    """The GGUF file llama.cpp loads."""
    n_ctx: int = 4096
    """llama.cpp's context size: its one KV cache, shared by its `parallel` slots."""
    llama_server: Path | None = None
    """The llama-server binary `bench/llama_server.py build` made."""
    peer_model_dir: Path | None = None
    """The folder mlx_lm.server loads when it differs from ours (its fastest: float32)."""

    def command(self, kind: Kind, port: int) -> list[str]:
        if kind == "llamacpp":
            assert self.gguf is not None
            assert self.llama_server is not None
            return llamacpp_command(
                self.llama_server, self.gguf, port, threads(), self.n_ctx, self.parallel
            )
        assert self.model_dir is not None
        if kind == "ours":
            return our_command(self.model_dir, port, self.parallel)
        peer_dir = self.peer_model_dir or self.model_dir
        return peer_command(peer_dir, port, self.parallel, self.prompt_concurrency)


def server_factory(
    kind: Kind,
    url: str | None,
    launch: Launch,
    log_path: Path,
    startup_timeout: float,
) -> Callable[[], Server]:
    """Connects to the server at `url`, or starts one as `launch` says."""

    def factory() -> Server:
        if url is not None:
            model = PEER_MODEL if kind == "peer" else our_model_name(url)
            server = Server(kind, url.rstrip("/"), model)
            wait_healthy(server, startup_timeout)
            return server
        port = free_port()
        command = launch.command(kind, port)
        slots = f"parallel {launch.parallel}"
        if kind == "llamacpp":
            slots += f", {threads()} threads, context {launch.n_ctx}"
        print(f"starting {kind} server on port {port} ({slots}) ...", flush=True)
        t0 = time.monotonic()
        server = start_server(kind, command, port, MODEL_NAMES[kind], log_path, startup_timeout)
        print(f"{kind} server ready in {time.monotonic() - t0:.1f}s", flush=True)
        return server

    return factory


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


def handle_stop_signals() -> None:
    """Make Ctrl-C and SIGTERM unwind through the finally blocks that stop the servers.

    Installing a handler for SIGINT also matters when this runs in the background, where
    the shell ignores SIGINT: an ignored signal stays ignored in the servers we start,
    while a handled one is reset to the default when they exec.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)


@contextlib.contextmanager
def running(factory: Callable[[], Server]) -> Iterator[Server]:
    server = factory()
    try:
        yield server
    finally:
        stop_server(server)


def our_model_name(base_url: str) -> str:
    """The first model id an already running server lists."""
    reply = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=10.0)
    reply.raise_for_status()
    return str(reply.json()["data"][0]["id"])
