"""HAProxy in front of several servers, for tests of replicas behind one address.

The proxy listens on a free loopback port and hands requests round-robin to the backends
(`mode http`: each request is balanced on its own, even on a kept-alive connection). It
neither buffers request bodies nor compresses, and its client and server timeouts are ten
minutes, so server-sent event streams pass through as they are written. No health checks:
a request sent to a backend that is down gets HAProxy's 503. The test command installs
`haproxy` (Debian package); a missing binary is an error, never a skip."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

from server_process import wait_ready
from support import free_port

BINARY = Path("/usr/sbin/haproxy")
READY_SECS = 30
STOP_SECS = 30


def config(port: int, backends: Sequence[str]) -> str:
    """The configuration: `127.0.0.1:port` balanced round-robin over `backends` (URLs)."""
    servers = []
    for n, url in enumerate(backends):
        parts = urlsplit(url)
        assert parts.scheme == "http", url
        assert parts.hostname, url
        assert parts.port, url
        servers.append(f"    server s{n} {parts.hostname}:{parts.port}")
    return "\n".join(
        [
            "global",
            "    maxconn 256",  # FDs it needs stay under a low limit (2 per connection)
            "defaults",
            "    mode http",
            "    timeout connect 5s",
            "    timeout client 600s",
            "    timeout server 600s",
            "frontend replicas",
            f"    bind 127.0.0.1:{port}",
            "    default_backend servers",
            "backend servers",
            "    balance roundrobin",
            *servers,
            "",
        ]
    )


class Haproxy:
    """An `haproxy -db` process in front of `backends`, accepting connections on `url`."""

    def __init__(self, backends: Sequence[str]) -> None:
        if not BINARY.exists():
            raise RuntimeError(
                f"{BINARY} is not installed: the README's test command installs it "
                "(apt-get install -y redis-server haproxy)"
            )
        assert backends, "haproxy needs at least one backend"
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="mlxcel-haproxy-"))
        self.log = self.dir / "haproxy.log"
        cfg = self.dir / "haproxy.cfg"
        cfg.write_text(config(self.port, backends))
        with self.log.open("wb") as out:
            self._proc = subprocess.Popen(
                [str(BINARY), "-f", str(cfg), "-db"], stdout=out, stderr=subprocess.STDOUT
            )
        try:
            self._wait_ready()
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _wait_ready(self) -> None:
        def accepts() -> bool:
            socket.create_connection(("127.0.0.1", self.port), timeout=2).close()
            return True

        wait_ready(
            "haproxy", self._proc, self.log.read_text, accepts, secs=READY_SECS, interval=0.02
        )

    def close(self) -> None:
        """Stop HAProxy (SIGTERM: it closes every connection at once) and remove its folder."""
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=STOP_SECS)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Haproxy:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()
