"""`--store rediss://...`: a server stores through a Redis that speaks only TLS, trusting
its certificate through the URL's `ssl_ca_certs`; one that does not trust it, or speaks
plain TCP to the TLS port, stops start-up with exit 2 and one clear line."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from server_process import MODEL, ServerProcesses, wait_ready
from support import free_port


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A redis-server whose clients must use TLS (port, CA certificate); a plain port on
    the side only tells when it is ready."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    openssl = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    openssl += ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"]
    subprocess.run(
        [*openssl, "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    plain, tls = free_port(), free_port()
    argv = ["redis-server", "--bind", "127.0.0.1", "--port", str(plain), "--save", ""]
    argv += ["--tls-port", str(tls), "--tls-cert-file", str(cert), "--tls-key-file", str(key)]
    argv += ["--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no", "--dir", str(tmp_path)]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    try:
        wait_ready(
            "redis-server", process, lambda: "", lambda: _pong(plain), secs=30, interval=0.02
        )
        yield tls, cert
    finally:
        process.terminate()
        process.wait(timeout=30)


def _pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def test_a_tls_redis_store_serves_and_stores(tls_redis: tuple[int, Path], tmp_path: Path) -> None:
    port, cert = tls_redis
    servers = ServerProcesses(tmp_path)
    try:
        url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}"
        first, second = servers.start_replicas(2, "--store", url)
        created = first.client().responses.create(model=MODEL, input="echo: over tls")
        assert second.client().responses.retrieve(created.id).output_text == "over tls"
    finally:
        servers.close()


def test_an_untrusted_or_plain_connection_stops_start_up(
    tls_redis: tuple[int, Path], tmp_path: Path
) -> None:
    port, _ = tls_redis
    servers = ServerProcesses(tmp_path)
    try:
        for url in (f"rediss://127.0.0.1:{port}/0", f"redis://127.0.0.1:{port}/0"):
            server = servers.launch("--store", url)
            assert server.proc.wait(timeout=60) == 2
            message = server.log.read_text()
            expected = f"fake-server: error: cannot reach the Redis store at {url}: "
            assert expected in message, message
            assert "Traceback" not in message
    finally:
        servers.close()


def test_a_password_in_the_url_is_never_printed(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    servers = ServerProcesses(tmp_path)
    try:
        server = servers.launch("--store", f"redis://mlxcel:s3cret-pw@127.0.0.1:{port}/0")
        assert server.proc.wait(timeout=60) == 2
        message = server.log.read_text()
        assert f"cannot reach the Redis store at redis://127.0.0.1:{port}/0: " in message
        assert "s3cret-pw" not in message
    finally:
        servers.close()
