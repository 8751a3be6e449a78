"""A real `redis-server` in its own process, for the Redis store's tests.

Each server listens on a free loopback port and keeps its append-only file (fsynced every
second) in a temporary folder of its own, so a test can stop it and start it again on the
same port and folder and find what it stored, SIGKILL it, or freeze it (SIGSTOP) to stand
for an unresponsive Redis. It speaks RESP over a plain socket (`call`), so it depends on no
Redis client library. The test command installs `redis-server` (Debian package); a missing
binary is an error, never a skip."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import TypeAlias

from server_process import wait_ready
from support import free_port

READY_SECS = 30
STOP_SECS = 30

Reply: TypeAlias = bytes | int | list["Reply"] | None


class RedisReplyError(Exception):
    """Redis answered a command with an error reply (`-ERR ...`)."""


def encode_command(*args: str | bytes) -> bytes:
    """A command as a RESP array of bulk strings."""
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode() if isinstance(arg, str) else arg
        parts += [f"${len(data)}\r\n".encode(), data, b"\r\n"]
    return b"".join(parts)


class _Reader:
    """Reads one RESP reply at a time from a blocking socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = b""

    def _fill(self) -> None:
        chunk = self._sock.recv(65536)
        if not chunk:
            raise ConnectionError("redis closed the connection")
        self._buf += chunk

    def _line(self) -> bytes:
        while b"\r\n" not in self._buf:
            self._fill()
        line, _, self._buf = self._buf.partition(b"\r\n")
        return line

    def _exactly(self, size: int) -> bytes:
        while len(self._buf) < size + 2:
            self._fill()
        data, self._buf = self._buf[:size], self._buf[size + 2 :]
        return data

    def reply(self) -> Reply:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            raise RedisReplyError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            return None if int(rest) < 0 else self._exactly(int(rest))
        if kind == b"*":
            return None if int(rest) < 0 else [self.reply() for _ in range(int(rest))]
        raise ValueError(f"not a RESP2 reply: {line!r}")


def _binary() -> str:
    found = shutil.which("redis-server")
    if found is None:
        raise RuntimeError(
            "redis-server is not installed: the README's test command installs it "
            "(apt-get install -y redis-server haproxy)"
        )
    return found


class RedisServer:
    """A `redis-server` process on 127.0.0.1, started at construction and answering PING.

    `stop` (SIGTERM: Redis flushes its append-only file and exits) and `kill` (SIGKILL: up to
    the last second of writes may be lost) end it; `start` brings it back on the same port
    and folder, reloading the append-only file. `pause`/`resume` freeze and thaw it: the
    kernel still accepts connections, but nothing is answered. `close` ends it and removes
    its folder."""

    def __init__(self) -> None:
        self._binary = _binary()
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="mlxcel-redis-"))
        self.log = self.dir / "redis.log"
        self._output = self.dir / "redis.out"  # what Redis prints before its log file opens
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start (again) on the same port and folder, and wait until PING answers."""
        assert not self.running, "redis-server is already running"
        argv = [self._binary, "--bind", "127.0.0.1", "--port", str(self.port)]
        argv += ["--dir", str(self.dir), "--save", "", "--appendonly", "yes"]
        argv += ["--appendfsync", "everysec", "--maxmemory-policy", "noeviction"]
        argv += ["--daemonize", "no", "--logfile", str(self.log)]
        with self._output.open("ab") as out:
            self._proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        self._paused = False
        self._wait_ready()

    def _wait_ready(self) -> None:
        assert self._proc is not None
        wait_ready(
            "redis-server",
            self._proc,
            self.logs,
            lambda: self.call("PING", timeout=2) == b"PONG",
            secs=READY_SECS,
            interval=0.02,
            # `-LOADING` while the append-only file is read back: keep waiting.
            errors=(OSError, RedisReplyError),
        )

    def logs(self) -> str:
        return "\n".join(p.read_text() for p in (self._output, self.log) if p.exists())

    def call(self, *args: str | bytes, timeout: float = 10) -> Reply:
        """One command on a new connection; raises `RedisReplyError` on an error reply
        and `TimeoutError` when no reply comes within `timeout` seconds."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            sock.sendall(encode_command(*args))
            return _Reader(sock).reply()

    def connect(self, timeout: float = 10) -> RedisConnection:
        """A connection of the caller's, for commands sent across a pause or an outage."""
        return RedisConnection(socket.create_connection(("127.0.0.1", self.port), timeout))

    def stop(self) -> None:
        """SIGTERM, and wait: Redis writes its append-only file out before it exits."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            if self._paused:  # a stopped process acts on SIGTERM only once it runs again
                self._proc.send_signal(signal.SIGCONT)
            self._proc.wait(timeout=STOP_SECS)
        self._paused = False

    def kill(self) -> None:
        """SIGKILL (a paused server too): writes of the last second may be lost."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait(timeout=STOP_SECS)
        self._paused = False

    def pause(self) -> None:
        """SIGSTOP: connections are still accepted, but no command is answered."""
        assert self._proc is not None
        assert self.running, "redis-server is not running"
        self._proc.send_signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT: the commands that waited are answered."""
        assert self._proc is not None
        assert self.running, "redis-server is not running"
        self._proc.send_signal(signal.SIGCONT)
        self._paused = False

    def close(self) -> None:
        """Stop (SIGKILL if SIGTERM is not enough) and remove the folder."""
        try:
            self.stop()
        except subprocess.TimeoutExpired:
            self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


class RedisConnection:
    """One open connection: send commands now, read their replies later."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._reader = _Reader(sock)

    def send(self, *args: str | bytes) -> None:
        self._sock.sendall(encode_command(*args))

    def reply(self, timeout: float = 10) -> Reply:
        """The next reply; `TimeoutError` when none comes within `timeout` seconds."""
        self._sock.settimeout(timeout)
        return self._reader.reply()

    def close(self) -> None:
        self._sock.close()
