"""End to end on the real model: the CPU acceleration as a user's environment sets it. A
server told to build for an instruction set that does not exist, or to keep the kernels
off, still starts and answers, and its log says in one line what runs."""

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
def serving(logs: Path, cpu_isa: str) -> Iterator[RealServer]:
    """The real server with one slot and `MLXCEL_CPU_ISA` set to `cpu_isa`."""
    servers = start_server(logs, "--parallel", "1", env={"MLXCEL_CPU_ISA": cpu_isa})
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
    with serving(tmp_path, "off") as server:
        answers(server)
        line = acceleration_line(server)
        assert line.rstrip().endswith("CPU kernels: MLX's own operations (MLXCEL_CPU_ISA=off)")
        answers(server)
