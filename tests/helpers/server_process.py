"""Server processes for tests, on the fake engine (`fake_server_main.py`) or the real one
(`mlxcel-server`): each is started with real command-line flags, waited for on `/health`,
and killed at the end whatever happened. `wait_ready` is the one readiness loop, shared
with the Redis and HAProxy helpers."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from openai import OpenAI

import mlxcel
from mlxcel.cli.serve import DEFAULT_ALIAS

from support import free_port

LAUNCHER = Path(__file__).with_name("fake_server_main.py")
MODEL = "fake-model"
READY_SECS = 60
"""How long a fake-engine server may take to answer `/health`."""
REAL_READY_SECS = 300
"""How long a real server may take (it loads the model first)."""
STOP_SECS = 30


def wait_ready(
    what: str,
    proc: subprocess.Popen[bytes],
    logs: Callable[[], str],
    probe: Callable[[], bool],
    *,
    secs: float,
    interval: float = 0.05,
    errors: tuple[type[BaseException], ...] = (OSError,),
) -> None:
    """Poll `probe` until it returns True; fail at once if `proc` exits, or after `secs`
    (either way with `logs()`). A probe raising one of `errors` is not ready yet."""
    deadline = time.monotonic() + secs
    while True:
        assert proc.poll() is None, f"{what} exited:\n{logs()}"
        assert time.monotonic() < deadline, f"{what} not ready:\n{logs()}"
        try:
            if probe():
                return
        except errors:
            pass
        time.sleep(interval)


def _environ(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment, importing the same `mlxcel` as this process does, with
    no `MLXCEL_` variable but those of `extra`."""
    root = str(Path(mlxcel.__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLXCEL_", "LLAMA_ARG_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))
    return {**env, **(extra or {})}


@dataclass
class ServerProcess:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    alias: str = MODEL
    """The model name it serves."""
    ready_secs: float = READY_SECS
    client_timeout: float = 30
    _clients: list[OpenAI] = field(default_factory=list)

    def client(self) -> OpenAI:
        """An SDK client for this server, closed when the server is killed or stopped."""
        client = OpenAI(
            base_url=f"{self.url}/v1",
            api_key="sk-no-auth",
            max_retries=0,
            timeout=self.client_timeout,
        )
        self._clients.append(client)
        return client

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30)

    def _close_clients(self) -> None:
        for client in self._clients:
            client.close()
        self._clients.clear()

    def kill(self) -> None:
        """SIGKILL: the process ends at once, whatever it was doing."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=STOP_SECS)
        self._close_clients()

    def stop(self) -> None:
        """SIGTERM (the server drains and exits), SIGKILL if it is still running after
        `STOP_SECS`."""
        self._close_clients()
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=STOP_SECS)
        except subprocess.TimeoutExpired:
            self.kill()

    def pause(self) -> None:
        """SIGSTOP: the process holds its connections but answers nothing (a hung replica);
        `kill` still ends it."""
        assert self.proc.poll() is None, f"server exited:\n{self.log.read_text()}"
        self.proc.send_signal(signal.SIGSTOP)

    def hangup(self) -> None:
        """SIGHUP: the server reads its keys file again."""
        assert self.proc.poll() is None, f"server exited:\n{self.log.read_text()}"
        self.proc.send_signal(signal.SIGHUP)

    def release(self) -> None:
        """SIGUSR1: a fake engine started with `hold` lets its held replies run on."""
        assert self.proc.poll() is None, f"server exited:\n{self.log.read_text()}"
        self.proc.send_signal(signal.SIGUSR1)

    def resume(self) -> None:
        """SIGCONT: the process carries on where `pause` froze it."""
        assert self.proc.poll() is None, f"server exited:\n{self.log.read_text()}"
        self.proc.send_signal(signal.SIGCONT)

    def wait_ready(self) -> None:
        """Wait until `/health` answers 200 (the model has loaded)."""

        def healthy() -> bool:
            return httpx.get(f"{self.url}/health", timeout=2).status_code == 200

        wait_ready(
            "server",
            self.proc,
            self.log.read_text,
            healthy,
            secs=self.ready_secs,
            errors=(httpx.TransportError,),
        )


RealServer = ServerProcess
"""A server process on a real model (`ServerProcesses.launch_real`)."""


class ServerProcesses:
    """Starts server processes; `close` kills every one still running."""

    def __init__(self, logs: Path) -> None:
        logs.mkdir(parents=True, exist_ok=True)
        self._logs = logs
        self._started: list[ServerProcess] = []

    def _spawn(
        self,
        argv: list[str],
        port: int,
        name: str,
        *,
        alias: str = MODEL,
        ready_secs: float = READY_SECS,
        client_timeout: float = 30,
        env: Mapping[str, str] | None = None,
    ) -> ServerProcess:
        log = self._logs / f"{name}-{len(self._started)}-{port}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=_environ(env))
        url = f"http://127.0.0.1:{port}"
        server = ServerProcess(proc, url, log, alias, ready_secs, client_timeout)
        self._started.append(server)
        return server

    def launch(
        self, *flags: str, step_delay: float = 0.0, hold: str | None = None
    ) -> ServerProcess:
        """A fake-engine server process, not waited for (its output goes to its own log);
        with `hold`, its replies that have that word are held in flight after their first
        word until `ServerProcess.release`."""
        port = free_port()
        argv = [sys.executable, str(LAUNCHER), "--port", str(port)]
        argv += ["--fake-step-delay", str(step_delay)]
        argv += [] if hold is None else ["--fake-hold", hold]
        argv += flags
        return self._spawn(argv, port, "server")

    def launch_real(self, *flags: str, env: Mapping[str, str] | None = None) -> ServerProcess:
        """`mlxcel-server` with `flags` (the default model unless `--model` says) and the
        `MLXCEL_` variables of `env`, not waited for."""
        port = free_port()
        exe = Path(sys.executable).with_name("mlxcel-server")
        argv = [str(exe), "--port", str(port), *flags]
        return self._spawn(
            argv,
            port,
            "real",
            alias=DEFAULT_ALIAS,
            ready_secs=REAL_READY_SECS,
            client_timeout=600,
            env=env,
        )

    def start(self, *flags: str, step_delay: float = 0.0, hold: str | None = None) -> ServerProcess:
        """A fake-engine server process answering `/health` (`launch` says what `hold` does)."""
        server = self.launch(*flags, step_delay=step_delay, hold=hold)
        server.wait_ready()
        return server

    def start_replicas(
        self, count: int, *flags: str, step_delay: float = 0.0
    ) -> list[ServerProcess]:
        """`count` fake-engine server processes with the same flags, started together and
        then each waited for on `/health` (they start in parallel, not one after another)."""
        replicas = [self.launch(*flags, step_delay=step_delay) for _ in range(count)]
        for replica in replicas:
            replica.wait_ready()
        return replicas

    def close(self) -> None:
        for server in self._started:
            server.kill()  # and its clients closed


def start_server(
    logs: Path, *flags: str, env: Mapping[str, str] | None = None
) -> Iterator[RealServer]:
    """The real server (`mlxcel-server`) with `flags` (and the `MLXCEL_` variables of
    `env`), once it answers `/health`, its log in the folder `logs`; stopped (SIGTERM) when
    the generator closes."""
    with _real_servers(logs, 1, flags, env) as (server,):
        yield server


def start_replicas(logs: Path, count: int, *flags: str) -> Iterator[list[RealServer]]:
    """`count` real servers, all with `flags`, started together (each loads the model at
    the same time as the others) and yielded once every one answers `/health`."""
    with _real_servers(logs, count, flags) as servers:
        yield servers


@contextlib.contextmanager
def _real_servers(
    logs: Path, count: int, flags: Sequence[str], env: Mapping[str, str] | None = None
) -> Iterator[list[RealServer]]:
    started = ServerProcesses(logs)
    servers: list[RealServer] = []
    try:
        servers = [started.launch_real(*flags, env=env) for _ in range(count)]
        for server in servers:
            server.wait_ready()
        yield servers
    finally:
        for server in servers:
            server.stop()
        started.close()
