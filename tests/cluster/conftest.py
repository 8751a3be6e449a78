"""Fixtures of the cluster tests: three replicas on the session's Redis, started once per
module, and a fourth of a test's own (one slot) for it to kill, freeze or stop."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from replica_cluster import Cluster, start_cluster

from redis_server import RedisServer
from server_process import ServerProcess, ServerProcesses


@pytest.fixture(scope="module")
def module_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcesses]:
    started = ServerProcesses(tmp_path_factory.mktemp("cluster"))
    try:
        yield started
    finally:
        started.close()


@pytest.fixture(scope="module")
def cluster(module_servers: ServerProcesses, redis_server: RedisServer) -> Cluster:
    """Three replicas on the session's Redis, under a prefix of this module's own."""
    return start_cluster(module_servers, redis_server, f"cluster-{time.monotonic_ns()}")


@pytest.fixture
def owner(servers: ServerProcesses, cluster: Cluster) -> ServerProcess:
    """A fourth replica on the cluster's store with one slot, for a test to kill or freeze;
    it holds the long reply (`support.LONG`, w0 w1 ...) in flight and runs the others."""
    return servers.start(*cluster.flags, "--parallel", "1", hold="w0")
