"""A webhook receiver for tests: a real HTTP server on 127.0.0.1 (the standard library's,
one thread per request) that records every delivery and answers as the test plans it:
a status code, or `HANG` (no answer until the receiver closes), one plan entry per
request, then 200."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from openai import OpenAI
from openai.types.webhooks import UnwrapWebhookEvent

HANG = "hang"
SECRET = "whsec_" + base64.b64encode(b"a webhook secret of 32 bytes....").decode()
"""The secret the tests' servers sign with."""


@dataclass(frozen=True)
class Hit:
    """One request the receiver got: its headers and body, as sent."""

    headers: dict[str, str]
    body: bytes
    at: float


class Receiver:
    def __init__(self, plan: list[int | str] | None = None) -> None:
        self.plan = list(plan or [])
        self.hits: list[Hit] = []
        self.location: str | None = None
        """Sent as `Location` with every answer (a redirect, with a 3xx in the plan)."""
        self._lock = threading.Lock()
        self._closing = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("content-length", "0"))
                body = self.rfile.read(size)
                headers = {k.lower(): v for k, v in self.headers.items()}
                with receiver._lock:
                    receiver.hits.append(Hit(headers, body, time.monotonic()))
                    answer = receiver.plan.pop(0) if receiver.plan else 200
                if answer == HANG:
                    receiver._closing.wait()
                    return
                assert isinstance(answer, int)
                self.send_response(answer)
                if receiver.location is not None:
                    self.send_header("location", receiver.location)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, fmt: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/hook"

    def wait_for(self, count: int, secs: float = 20.0) -> list[Hit]:
        """The first `count` hits, once there are that many (AssertionError after `secs`)."""
        deadline = time.monotonic() + secs
        while True:
            with self._lock:
                if len(self.hits) >= count:
                    return self.hits[:count]
            assert time.monotonic() < deadline, f"{len(self.hits)} of {count} deliveries"
            time.sleep(0.02)

    def close(self) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def receiver(plan: list[int | str] | None = None) -> Iterator[Receiver]:
    r = Receiver(plan)
    try:
        yield r
    finally:
        r.close()


def unwrap(hit: Hit, secret: str = SECRET) -> UnwrapWebhookEvent:
    """The delivery as the openai SDK verifies and parses it (raises if it does not verify)."""
    with OpenAI(api_key="unused", webhook_secret=secret) as client:
        return client.webhooks.unwrap(hit.body, hit.headers)
