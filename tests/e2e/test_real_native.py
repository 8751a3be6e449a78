"""End to end on the real model: the CPU acceleration as a user's environment sets it. A
server told to build for an instruction set that does not exist, or to keep the kernels
off, still starts and answers, and its log says in one line what runs. The fused layers
(``MLXCEL_FUSED_LAYER=1``) answer what the composed ones answer, over HTTP."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mlxcel.model.native.build import probe

from server_process import RealServer, start_server

pytestmark = pytest.mark.e2e


@contextlib.contextmanager
def serving(logs: Path, cpu_isa: str = "", fused: str = "") -> Iterator[RealServer]:
    """The real server with one slot, `MLXCEL_CPU_ISA` and `MLXCEL_FUSED_LAYER` as given."""
    env = {"MLXCEL_CPU_ISA": cpu_isa, "MLXCEL_FUSED_LAYER": fused}
    servers = start_server(logs, "--parallel", "1", env={k: v for k, v in env.items() if v})
    try:
        yield next(servers)
    finally:
        servers.close()


def answers(server: RealServer) -> None:
    """`/health` answers, and an ordinary request completes with text."""
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    response = server.client().responses.create(
        model=server.alias, input="Say hello in three words.", max_output_tokens=16
    )
    assert response.status == "completed"
    assert response.output_text.strip()


def acceleration_line(server: RealServer) -> str:
    lines = [line for line in server.log.read_text().splitlines() if "CPU kernels:" in line]
    assert len(lines) == 1, server.log.read_text()  # one line, once
    assert "CPU: " in lines[0]
    assert "BLAS: openblas (scipy-openblas32 " in lines[0]
    return lines[0]


@pytest.mark.skipif(not probe().runs("avx2"), reason="the kernels need AVX2 or AVX-512")
def test_an_unknown_instruction_set_is_refused_and_the_cpus_own_build_serves(
    tmp_path: Path,
) -> None:
    with serving(tmp_path, "sse9") as server:
        answers(server)
        log = server.log.read_text()
        assert "MLXCEL_CPU_ISA='sse9' is not one of avx512, avx2, generic or off; ignored" in log
        line = acceleration_line(server)
        assert f"CPU kernels: mlxcel's own ({probe().isa}, on the BLAS shim's pool of " in line
        answers(server)


def test_with_the_kernels_off_mlx_own_operations_serve_and_the_log_says_so(
    tmp_path: Path,
) -> None:
    with serving(tmp_path, "off", fused="1") as server:
        answers(server)
        line = acceleration_line(server)
        assert line.rstrip().endswith("CPU kernels: MLX's own operations (MLXCEL_CPU_ISA=off)")
        assert layers_lines(server) == [
            "Layers: composed MLX operations (the fused layer does not apply: "
            "the CPU kernels are not loaded)"
        ]
        answers(server)


def layers_lines(server: RealServer) -> list[str]:
    """The log's lines saying which layer runs (the message, without the log's prefix)."""
    lines = server.log.read_text().splitlines()
    return [line[line.index("Layers: ") :] for line in lines if "Layers: " in line]


PROMPTS = ("Write a Python function that reverses a string.", "Name three prime numbers.")


def greedy_texts(server: RealServer) -> list[str]:
    """Greedy Chat Completions of the prompts, one at a time (a decode batch of one row)."""
    client = server.client()
    texts = []
    for prompt in PROMPTS:
        completion = client.chat.completions.create(
            model=server.alias,
            messages=[{"role": "user", "content": prompt}],
            temperature=0,
            max_tokens=32,
        )
        texts.append(completion.choices[0].message.content or "")
    return texts


@pytest.mark.skipif(not probe().runs("avx2"), reason="the kernels need AVX2 or AVX-512")
def test_the_fused_layers_answer_what_the_composed_ones_answer(tmp_path: Path) -> None:
    with serving(tmp_path / "fused", fused="1") as server:
        assert layers_lines(server)[0].startswith("Layers: fused (one native head and tail")
        fused = greedy_texts(server)
        answers(server)
    with serving(tmp_path / "composed") as server:
        assert layers_lines(server) == [
            "Layers: composed MLX operations (the default; MLXCEL_FUSED_LAYER=1 fuses)"
        ]
        composed = greedy_texts(server)
        answers(server)
    assert all(text.strip() for text in fused)
    assert fused == composed
