"""Fake-engine servers in their own processes (`fake_server_main.py`), for tests that kill,
freeze or restart a server, or run several replicas: each is started with real
command-line flags, waited for on `/health`, and killed at the end whatever happened."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from openai import OpenAI

import mlxcel

from support import free_port

LAUNCHER = Path(__file__).with_name("fake_server_main.py")
MODEL = "fake-model"
READY_SECS = 60


def _environ() -> dict[str, str]:
    """This process's environment, importing the same `mlxcel` as this process does."""
    root = str(Path(mlxcel.__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLXCEL_", "LLAMA_ARG_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))
    return env


@dataclass
class ServerProcess:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    _clients: list[OpenAI] = field(default_factory=list)

    def client(self) -> OpenAI:
        client = OpenAI(base_url=f"{self.url}/v1", api_key="sk-no-auth", max_retries=0, timeout=30)
        self._clients.append(client)
        return client

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30)

    def kill(self) -> None:
        """SIGKILL: the process ends at once, whatever it was doing."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        for client in self._clients:
            client.close()

    def pause(self) -> None:
        """SIGSTOP: the process holds its connections but answers nothing (a hung replica);
        `kill` still ends it."""
        assert self.proc.poll() is None, f"server exited:\n{self.log.read_text()}"
        self.proc.send_signal(signal.SIGSTOP)

    def hangup(self) -> None:
        """SIGHUP: the server reads its keys file again."""
        assert self.proc.poll() is None, f"server exited:\n{self.log.read_text()}"
        self.proc.send_signal(signal.SIGHUP)

    def resume(self) -> None:
        """SIGCONT: the process carries on where `pause` froze it."""
        assert self.proc.poll() is None, f"server exited:\n{self.log.read_text()}"
        self.proc.send_signal(signal.SIGCONT)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_SECS
        while True:
            assert self.proc.poll() is None, f"server exited:\n{self.log.read_text()}"
            assert time.monotonic() < deadline, f"server not ready:\n{self.log.read_text()}"
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)


class ServerProcesses:
    """Starts fake-engine server processes; `close` kills every one still running."""

    def __init__(self, logs: Path) -> None:
        self._logs = logs
        self._started: list[ServerProcess] = []

    def launch(self, *flags: str, step_delay: float = 0.0) -> ServerProcess:
        """A server process, not waited for (its output goes to its own log file)."""
        port = free_port()
        log = self._logs / f"server-{len(self._started)}-{port}.log"
        argv = [sys.executable, str(LAUNCHER), "--port", str(port)]
        argv += ["--fake-step-delay", str(step_delay), *flags]
        with log.open("w") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=_environ())
        server = ServerProcess(proc, f"http://127.0.0.1:{port}", log)
        self._started.append(server)
        return server

    def start(self, *flags: str, step_delay: float = 0.0) -> ServerProcess:
        """A server process answering `/health`."""
        server = self.launch(*flags, step_delay=step_delay)
        server.wait_ready()
        return server

    def start_replicas(
        self, count: int, *flags: str, step_delay: float = 0.0
    ) -> list[ServerProcess]:
        """`count` server processes with the same flags, started together and then each
        waited for on `/health` (they start in parallel, not one after another)."""
        replicas = [self.launch(*flags, step_delay=step_delay) for _ in range(count)]
        for replica in replicas:
            replica.wait_ready()
        return replicas

    def close(self) -> None:
        for server in self._started:
            server.kill()  # and its clients closed
