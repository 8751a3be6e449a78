"""End to end on the real model: a long prompt's KV state outlives its server in the
prompt cache's disk tier (SIGTERM, restart, the same prompt is served from the file and
answers the same), a tampered file is ignored, another tenant never gets it, and a disk
that cannot take the files never stops the serving; the files and folders are the
owner's alone (0600, 0700) whatever the umask."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from server_process import start_server

pytestmark = pytest.mark.e2e

server = contextlib.contextmanager(start_server)

KEYS = ("key-alice", "key-bob")
LINE = "def route_{n}(parcel):\n    return parcel.weight * {n} + {m}  # depot {n}\n"
DOCUMENT = "".join(LINE.format(n=n, m=n * 7 % 13) for n in range(78))
PROMPT = (
    "Here is a module of routing rules.\n\n" + DOCUMENT + "\nWhich rule has the largest factor?"
)


def ask(url: str, key: str, model: str) -> tuple[str, int, int]:
    """The greedy answer, the prompt's tokens and those the prompt cache served."""
    with client_for(url, key) as client:
        resp = client.responses.create(
            model=model, input=PROMPT, max_output_tokens=24, temperature=0
        )
    assert resp.usage is not None
    return resp.output_text, resp.usage.input_tokens, resp.usage.input_tokens_details.cached_tokens


def hang_up(url: str, key: str, model: str) -> None:
    """Stream the prompt and leave at the first text delta."""
    with (
        client_for(url, key) as client,
        client.responses.create(
            model=model, input=PROMPT, max_output_tokens=24, temperature=0, stream=True
        ) as stream,
    ):
        for event in stream:
            if event.type == "response.output_text.delta":
                break


def client_for(url: str, key: str) -> OpenAI:
    """A client of its own (closed by its `with`: no socket outlives the server)."""
    return OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=900)


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {KEYS[0]}"}).text
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name)]
    assert values, f"{name} not in /metrics"
    return sum(values)


def test_a_long_prompt_is_served_from_disk_after_a_restart(tmp_path: Path) -> None:
    folder = tmp_path / "prompt-cache"
    flags = ("--parallel", "1", "--prompt-cache-dir", str(folder), "--api-key", ",".join(KEYS))
    with server(tmp_path / "cold", *flags) as cold:
        text, tokens, cached = ask(cold.url, KEYS[0], cold.alias)
        assert tokens > 1500
        assert cached == 0
    files = list(folder.rglob("*.safetensors"))
    assert files  # written at shutdown

    with server(tmp_path / "warm", *flags) as warm:
        again, _, cached = ask(warm.url, KEYS[0], warm.alias)
        assert again == text  # the same greedy answer as the cold read
        assert cached >= tokens - 2  # all but the last token (or two) from the file
        assert metric(warm.url, "mlxcel_prompt_cache_disk_hits_total") == 1
        other, _, cached = ask(warm.url, KEYS[1], warm.alias)
        assert cached == 0  # the other tenant reads it all: never alice's file
        assert other == text
        hang_up(warm.url, KEYS[1], warm.alias)  # bob leaves mid-answer
        assert ask(warm.url, KEYS[0], warm.alias)[0] == text

    for path in folder.rglob("*.safetensors"):  # damage every file, keeping its header
        raw = bytearray(path.read_bytes())
        raw[-100] ^= 0x10
        path.write_bytes(bytes(raw))
    with server(tmp_path / "tampered", *flags) as tampered:
        after, _, cached = ask(tampered.url, KEYS[0], tampered.alias)
        assert cached == 0
        assert after == text
        assert metric(tampered.url, "mlxcel_prompt_cache_disk_rejected_total") >= 1
        assert httpx.get(f"{tampered.url}/health").status_code == 200


def test_a_prompt_cache_dir_that_cannot_be_written_stops_the_start(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    exe = Path(sys.executable).with_name("mlxcel-server")
    done = subprocess.run(
        [str(exe), "--port", "0", "--prompt-cache-dir", str(blocker / "cache")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "--prompt-cache-dir" in done.stderr
    assert "cannot write" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_budget_too_small_for_any_file_keeps_serving(tmp_path: Path) -> None:
    folder = tmp_path / "prompt-cache"
    flags = ("--parallel", "1", "--prompt-cache-dir", str(folder))
    flags += ("--prompt-cache-disk-bytes", "4096", "--api-key", KEYS[0])
    with server(tmp_path / "small", *flags) as small:
        with client_for(small.url, KEYS[0]) as client:
            short = client.responses.create(
                model=small.alias, input="Say OK.", max_output_tokens=4, temperature=0
            )
        assert short.status == "completed"
    with server(tmp_path / "small-again", *flags) as again:
        with client_for(again.url, KEYS[0]) as client:
            reply = client.responses.create(
                model=again.alias, input="Say OK.", max_output_tokens=4, temperature=0
            )
        assert reply.output_text == short.output_text
        assert metric(again.url, "mlxcel_prompt_cache_disk_files") == 0
        assert httpx.get(f"{again.url}/health").status_code == 200
    assert list(folder.rglob("*.safetensors")) == []


def test_the_files_a_server_writes_are_its_users_alone(tmp_path: Path) -> None:
    """With umask 022, `--store sqlite` and the folder an earlier release left open
    (0755, a 0644 file of another model), every folder is 0700 and every file 0600 once
    the server has served a request and stopped (it writes its cache then)."""
    folder = tmp_path / "prompt-cache"
    stale = folder / "0123456789abcdef" / "other-model.safetensors"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"another model's prompt")
    for path, wide in ((folder, 0o755), (stale.parent, 0o755), (stale, 0o644)):
        os.chmod(path, wide)
    store = f"sqlite:{tmp_path / 'store.sqlite3'}"
    flags = ("--parallel", "1", "--store", store, "--prompt-cache-dir", str(folder))
    old = os.umask(0o022)  # the server process inherits it
    try:
        with server(tmp_path / "logs", *flags, "--api-key", KEYS[0]) as running:
            with client_for(running.url, KEYS[0]) as client:
                reply = client.responses.create(
                    model=running.alias, input="Say OK.", max_output_tokens=4, temperature=0
                )
            assert reply.status == "completed"
            assert httpx.get(f"{running.url}/health").status_code == 200
    finally:
        os.umask(old)
    written = [p for p in folder.rglob("*.safetensors") if p != stale]
    assert written  # this model's cache, written at shutdown
    modes = {p: stat.S_IMODE(p.stat().st_mode) for p in [folder, *folder.rglob("*")]}
    assert {p: m for p, m in modes.items() if p.is_dir() and m != 0o700} == {}
    assert {p: m for p, m in modes.items() if p.is_file() and m != 0o600} == {}
