"""The keys file read again on SIGHUP, in a real server process: the new keys are
accepted and the removed ones refused, a broken file keeps the keys in use, and the
server's whole log never shows a key (only names and hashes)."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import openai
import pytest
from openai import OpenAI

from mlxcel.http.guards import key_name

from server_process import MODEL, ServerProcess, ServerProcesses
from support import KeysFile

KEYS = ("sk-flag-7f3a", "sk-old-19c2", "sk-new-55d0", "sk-anon-e81b", "sk-bad-0000")


def status(server: ServerProcess, key: str) -> int:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        headers = {"Authorization": f"Bearer {key}"}
        return http.get("/v1/models", headers=headers).status_code


def wait_for(predicate: Callable[[], bool], server: ServerProcess) -> None:
    """Poll until the server shows the effect of a signal (handled asynchronously)."""
    deadline = time.monotonic() + 20
    while not predicate():
        assert time.monotonic() < deadline, server.log.read_text()
        time.sleep(0.05)


def test_sighup_reloads_the_keys_file_and_no_key_is_ever_logged(
    servers: ServerProcesses, keys_file: KeysFile
) -> None:
    path = keys_file("old:sk-old-19c2 rpm=5\n")
    server = servers.start("--api-key", "sk-flag-7f3a", "--api-key-file", str(path))
    assert status(server, "sk-old-19c2") == 200
    assert status(server, "sk-flag-7f3a") == 200
    assert status(server, "sk-new-55d0") == 401

    keys_file("# rotated\nnew:sk-new-55d0\nsk-anon-e81b\n")
    server.hangup()
    wait_for(lambda: status(server, "sk-new-55d0") == 200, server)
    assert status(server, "sk-old-19c2") == 401
    assert status(server, "sk-anon-e81b") == 200
    assert status(server, "sk-flag-7f3a") == 200  # the flag's key stays

    with (
        OpenAI(base_url=f"{server.url}/v1", api_key="sk-new-55d0", max_retries=0) as new,
        OpenAI(base_url=f"{server.url}/v1", api_key="sk-old-19c2", max_retries=0) as old,
    ):
        assert new.responses.create(model=MODEL, input="hi").status == "completed"
        with pytest.raises(openai.AuthenticationError):
            old.responses.create(model=MODEL, input="hi")

    keys_file("new:sk-new-55d0\nnew:sk-bad-0000\n")  # a duplicate name
    server.hangup()
    wait_for(lambda: "line 2: the name new is taken" in server.log.read_text(), server)
    assert status(server, "sk-new-55d0") == 200  # the keys in use stay
    assert status(server, "sk-bad-0000") == 401

    path.unlink()
    server.hangup()
    wait_for(lambda: "cannot be read" in server.log.read_text(), server)
    assert status(server, "sk-anon-e81b") == 200

    log = server.log.read_text()
    for key in KEYS:
        assert key not in log
    for name in ("new", key_name("sk-anon-e81b"), key_name("sk-flag-7f3a")):
        assert f"key={name} " in log  # the access log names the callers
    assert "status=401" in log


def test_a_limit_in_unicode_digits_keeps_the_server_and_its_old_keys(
    servers: ServerProcesses, keys_file: KeysFile
) -> None:
    """`rpm=²` passed `str.isdigit` and `int` refused it: the reload's ValueError ended
    the server. Now it is the file's error like any other, and the old keys stay."""
    path = keys_file("old:sk-old-19c2 rpm=5\n")
    server = servers.start("--api-key-file", str(path))
    assert status(server, "sk-old-19c2") == 200

    path.write_text("old:sk-old-19c2 rpm=\u00b2\nnew:sk-new-55d0\n")
    server.hangup()
    wait_for(lambda: "rpm must be a whole number" in server.log.read_text(), server)
    assert server.proc.poll() is None
    assert status(server, "sk-old-19c2") == 200
    assert status(server, "sk-new-55d0") == 401


def test_sighup_grants_and_takes_back_the_admin_right(
    servers: ServerProcesses, keys_file: KeysFile
) -> None:
    """A key made an admin by the keys file may load and unload models after the SIGHUP
    that reads it, and one no longer marked so may not; the log names them, never shows
    their keys."""
    root, bob = "sk-root-8e2a", "sk-bob-3f71"
    path = keys_file(f"root:{root} admin=true\nbob:{bob}\n")
    server = servers.start("--api-key-file", str(path))

    def unload(key: str) -> int:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            headers = {"Authorization": f"Bearer {key}"}
            return http.post(f"/v1/models/{MODEL}/unload", headers=headers).status_code

    assert unload(bob) == 403
    assert unload(root) == 200
    keys_file(f"root:{root} admin=false\nbob:{bob} admin=true\n")
    server.hangup()
    wait_for(lambda: unload(bob) == 200, server)
    assert unload(root) == 403
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.get("/health").status_code == 200
    with OpenAI(base_url=f"{server.url}/v1", api_key=root, max_retries=0) as client:
        assert client.responses.create(model=MODEL, input="hi").status == "completed"
    log = server.log.read_text()
    assert "key=bob action=unload model=fake-model refused=permission_denied" in log
    assert "key=bob action=unload model=fake-model\n" in log
    assert root not in log
    assert bob not in log
