"""Two real MLX models by name in one server process (the default model and the tiny
test model): each answers as itself, at most one is loaded, an idle model is unloaded
and its memory returned (the process's resident set drops), and it loads again."""

from __future__ import annotations

import time
from pathlib import Path

from mlxcel.model.provision.fetch import default_model_dir

from server_process import ServerProcess, ServerProcesses
from tiny_model import ensure_tiny_model


def _rss_mb(server: ServerProcess) -> float:
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _returned_mb(server: ServerProcess, loaded_mb: float, want: float) -> float:
    """How far the resident set fell below `loaded_mb`, waiting up to 5 s for `want`:
    the allocator hands freed pages back in its own time, and keeps some (measured drops
    for the 486 MB default model: 150-250 MB)."""
    started = time.monotonic()
    while (returned := loaded_mb - _rss_mb(server)) <= want and time.monotonic() - started < 5:
        time.sleep(0.25)
    return returned


def _states(server: ServerProcess) -> dict[str, str]:
    listed = server.client().models.list()
    return {m.id: m.model_extra["state"] for m in listed.data}  # type: ignore[index]


def _until(server: ServerProcess, model: str, state: str, patience: float) -> float:
    started = time.monotonic()
    while _states(server)[model] != state:
        assert time.monotonic() - started < patience, _states(server)
        time.sleep(0.1)
    return time.monotonic() - started


def test_two_real_models_load_on_demand_and_unload_when_idle(tmp_path: Path) -> None:
    servers = ServerProcesses(tmp_path)
    try:
        coder, tiny = default_model_dir(), ensure_tiny_model()
        server = servers.launch_real(
            "--model", f"coder={coder}", "--model", f"tiny={tiny}", "--idle-unload-secs", "1"
        )
        server.wait_ready()
        assert _states(server) == {"coder": "loaded", "tiny": "unloaded"}
        client = server.client()
        small = client.responses.create(model="tiny", input="hi", max_output_tokens=4)
        assert small.model == "tiny"
        assert _states(server)["tiny"] == "loaded"
        answer = client.responses.create(
            model="coder", input="Reply with the word: yes", max_output_tokens=8, temperature=0
        )
        assert answer.model == "coder"
        assert "yes" in answer.output_text.lower()
        assert _states(server) == {"coder": "loaded", "tiny": "unloaded"}  # one at a time
        loaded_mb = _rss_mb(server)
        _until(server, "coder", "unloaded", patience=10)  # idle 1 s (checked each 0.25 s)
        assert _returned_mb(server, loaded_mb, 100) > 100, loaded_mb  # a 486 MB folder
        again = client.responses.create(model="coder", input="hi", max_output_tokens=2)
        assert again.status in ("completed", "incomplete")
        with server.http() as http:
            assert http.get("/health").json()["models"]["coder"] == "loaded"
    finally:
        servers.close()
