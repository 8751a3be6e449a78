"""A PDF that is cheap to send and costly to read: some 14 KB whose thousand pages share
one content stream of 1.9 million operators, parsed anew for each page (hours of CPU).
Over real HTTP: a 400 naming the part within a bounded time, two at once leave ordinary
requests and `/health` answering meanwhile, and a server told to stop stops at once."""

from __future__ import annotations

import base64
import functools
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any

import httpx
import trio

from mlxcel.http.pdf_reading import PDF_CPU_SECS

from pdf_files import costly_pdf
from server_process import ServerProcess, ServerProcesses
from support import FakeServer, an_ordinary_request_completes, raw_request

ANSWER_SECS = 30
"""Generous: the file is refused once its budget is spent (a few seconds of CPU)."""
STOP_SECS = 15


@functools.cache
def costly_body() -> dict[str, Any]:
    """A Responses body whose `input[0].content[1]` is the costly PDF."""
    url = "data:application/pdf;base64," + base64.b64encode(costly_pdf()).decode()
    part = {"type": "input_file", "filename": "costly.pdf", "file_data": url}
    text = {"type": "input_text", "text": "Read this:"}
    return {"model": "fake-model", "input": [{"role": "user", "content": [text, part]}]}


def assert_refused(status: int, body: dict[str, Any]) -> None:
    assert status == 400, body
    error = body["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "input[0].content[1]"
    assert "too costly to read" in error["message"]


async def answer_of(stream: trio.SocketStream) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of the one answer on a raw connection."""
    seen = b""
    while b"\r\n\r\n" not in seen:
        chunk = await stream.receive_some()
        assert chunk, seen
        seen += chunk
    head, _, body = seen.partition(b"\r\n\r\n")
    fields = dict(line.split(b":", 1) for line in head.lower().split(b"\r\n")[1:])
    while len(body) < int(fields[b"content-length"]):
        chunk = await stream.receive_some()
        assert chunk, seen
        body += chunk
    return int(head.split(b" ")[1]), json.loads(body)


def readers_of(pid: int) -> list[int]:
    """The PDF reading processes the server process `pid` runs now."""
    found = subprocess.run(
        ["pgrep", "-P", str(pid), "-f", "pdf_worker"], capture_output=True, text=True
    )
    return [int(reader) for reader in found.stdout.split()]


async def test_a_costly_pdf_is_a_400_naming_the_part(fake_server: FakeServer) -> None:
    with trio.fail_after(ANSWER_SECS):
        async with httpx.AsyncClient(timeout=ANSWER_SECS) as http:
            r = await http.post(f"{fake_server.url}/v1/responses", json=costly_body())
    assert_refused(r.status_code, r.json())
    await an_ordinary_request_completes(fake_server)


async def test_two_costly_pdfs_leave_ordinary_requests_answering(
    fake_server: FakeServer,
) -> None:
    """Both costly files are being read while an ordinary request comes and goes."""
    streams = [await raw_request(fake_server.url, costly_body()) for _ in range(2)]
    try:
        with trio.fail_after(STOP_SECS):  # this process serves: its readers are ours
            # Polled: the processes are not ours to signal.
            while len(await trio.to_thread.run_sync(readers_of, os.getpid())) < 2:  # noqa: ASYNC110
                await trio.sleep(0.05)
        await an_ordinary_request_completes(fake_server, within=20)
        with trio.fail_after(ANSWER_SECS):
            for stream in streams:
                assert_refused(*await answer_of(stream))
    finally:
        for stream in streams:
            await stream.aclose()
    await an_ordinary_request_completes(fake_server)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def send_costly(server: ServerProcess, count: int) -> list[socket.socket]:
    """`count` connections, each having sent a body with the costly PDF."""
    host, port = server.url.removeprefix("http://").split(":")
    payload = json.dumps(costly_body()).encode()
    head = (
        f"POST /v1/responses HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    clients = [socket.create_connection((host, int(port))) for _ in range(count)]
    for client in clients:
        client.sendall(head + payload)
    return clients


def wait_for(predicate: Callable[[], bool], secs: float) -> bool:
    deadline = time.monotonic() + secs
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


def test_a_server_reading_costly_pdfs_stops_at_once(servers: ServerProcesses) -> None:
    """SIGTERM while two costly files are read: the server exits within seconds, its
    readers with it, and each client gets an answer (a 503: retry elsewhere)."""
    server = servers.start()
    clients = send_costly(server, 2)
    try:
        assert wait_for(lambda: len(readers_of(server.proc.pid)) == 2, STOP_SECS)
        readers = readers_of(server.proc.pid)
        with server.http() as http:
            assert http.get("/health").status_code == 200
        answer = server.client().responses.create(model="fake-model", input="echo: still here")
        assert answer.output_text == "still here"
        server.proc.terminate()
        server.proc.wait(timeout=STOP_SECS)
        for client in clients:
            assert client.recv(4096).startswith(b"HTTP/1.1 503")
    finally:
        for client in clients:
            client.close()
    assert server.proc.returncode == 0, server.log.read_text()
    assert all(gone(pid) for pid in readers)


def test_a_client_that_hangs_up_ends_its_reading(servers: ServerProcesses) -> None:
    """The request is cancelled, its reading process killed; the server carries on."""
    server = servers.start()
    (client,) = send_costly(server, 1)
    with client:
        assert wait_for(lambda: len(readers_of(server.proc.pid)) == 1, STOP_SECS)
        (reader,) = readers_of(server.proc.pid)
    # Sooner than its CPU limit would end it (it has barely begun).
    assert wait_for(lambda: gone(reader), PDF_CPU_SECS - 1)
    with server.http() as http:
        assert http.get("/health").status_code == 200
    answer = server.client().responses.create(model="fake-model", input="echo: still here")
    assert answer.output_text == "still here"
