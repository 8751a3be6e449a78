"""The real `redis-server` the Redis store's tests run on: it answers on its own port,
keeps what it stored across a stop and a start (append-only file), and a paused server
answers nothing until it is resumed."""

from __future__ import annotations

import re
import shutil
import socket

import pytest

from redis_server import RedisReplyError, RedisServer


def test_it_answers_a_raw_ping_on_the_port_its_url_names(own_redis: RedisServer) -> None:
    assert own_redis.url == f"redis://127.0.0.1:{own_redis.port}/0"
    with socket.create_connection(("127.0.0.1", own_redis.port), timeout=10) as sock:
        sock.sendall(b"*1\r\n$4\r\nPING\r\n")
        assert sock.recv(64) == b"+PONG\r\n"


def test_replies_are_read_as_values(own_redis: RedisServer) -> None:
    assert own_redis.call("SET", "k", "v\r\nw") == b"OK"
    assert own_redis.call("GET", "k") == b"v\r\nw"
    assert own_redis.call("GET", "missing") is None
    assert own_redis.call("RPUSH", "l", "a", "b") == 2
    assert own_redis.call("LRANGE", "l", "0", "-1") == [b"a", b"b"]
    with pytest.raises(RedisReplyError, match="WRONGTYPE"):
        own_redis.call("GET", "l")
    # Eviction would lose stored responses silently: memory runs out as errors instead.
    assert own_redis.call("CONFIG", "GET", "maxmemory-policy") == [
        b"maxmemory-policy",
        b"noeviction",
    ]


def test_a_key_survives_a_stop_and_a_start(own_redis: RedisServer) -> None:
    assert own_redis.call("SET", "kept", "héllo".encode()) == b"OK"
    port = own_redis.port
    own_redis.stop()
    assert not own_redis.running
    with pytest.raises(ConnectionRefusedError):
        own_redis.call("PING")
    own_redis.start()
    assert own_redis.port == port
    assert own_redis.call("GET", "kept") == "héllo".encode()


def test_a_killed_server_starts_again_on_its_port_with_what_it_had_synced(
    own_redis: RedisServer,
) -> None:
    own_redis.call("SET", "synced", "1")
    own_redis.stop()  # written out
    own_redis.start()
    own_redis.kill()
    assert not own_redis.running
    own_redis.start()
    assert own_redis.call("GET", "synced") == b"1"


def test_a_paused_server_answers_nothing_until_resumed(own_redis: RedisServer) -> None:
    conn = own_redis.connect()
    try:
        conn.send("PING")
        assert conn.reply() == b"PONG"
        own_redis.pause()
        conn.send("SET", "k", "v")
        with pytest.raises(TimeoutError):
            conn.reply(timeout=0.5)
        with pytest.raises(TimeoutError):
            own_redis.call("PING", timeout=0.5)  # new connections too
        own_redis.resume()
        assert conn.reply() == b"OK"  # the command that waited
        assert own_redis.call("GET", "k") == b"v"
    finally:
        conn.close()


def test_a_paused_server_can_be_stopped_and_started(own_redis: RedisServer) -> None:
    own_redis.call("SET", "k", "v")
    own_redis.pause()
    own_redis.stop()
    own_redis.start()
    assert own_redis.call("GET", "k") == b"v"


@pytest.mark.slow  # a redis-server process of its own
def test_close_ends_it_and_removes_its_folder() -> None:
    server = RedisServer()
    folder = server.dir
    assert (folder / "redis.log").exists()
    server.close()
    assert not server.running
    assert not folder.exists()


def test_a_missing_binary_is_an_error_naming_the_install_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "")  # `shutil.which` finds nothing
    assert shutil.which("redis-server") is None
    with pytest.raises(RuntimeError, match="test command installs it"):
        RedisServer()


def test_the_session_server_and_a_prefix_per_test(
    redis_server: RedisServer, redis_store: str, redis_prefix: str
) -> None:
    assert redis_store == redis_server.url
    assert re.fullmatch(r"t-[0-9a-f]{8}", redis_prefix)
    key = f"{redis_prefix}:probe"
    assert redis_server.call("SET", key, "1", "NX") == b"OK"  # no other test had this key
    assert redis_server.call("DEL", key) == 1
