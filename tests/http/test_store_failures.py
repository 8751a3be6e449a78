"""A SQLite store that cannot be written for a while (another program holds its write
lock): requests get a clear 503, the server stays up, and what was stored is intact once
the file is free again."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx

from support import StartServer, in_thread, post


async def test_a_locked_store_file_answers_503_and_recovers(
    start_fake_server: StartServer, tmp_path: Path
) -> None:
    path = tmp_path / "store.sqlite3"
    server = await start_fake_server(store=f"sqlite:{path}")
    client = server.client()
    kept = await in_thread(client.responses.create, model="fake-model", input="echo: kept")

    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # a backup or a shell holding the write lock
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            got = await http.get(f"/v1/responses/{kept.id}")
            assert got.status_code == 503
            assert got.json()["error"]["code"] == "store_unavailable"
            assert got.json()["error"]["type"] == "server_error"
            assert got.headers["Retry-After"] == "1"
            job = await post(
                server,
                "/v1/responses",
                {"model": "fake-model", "input": "echo: later", "background": True},
            )
            assert job.status_code == 503
            assert job.json()["error"]["code"] == "store_unavailable"
            # A response that need not be stored is still served.
            free = await post(
                server,
                "/v1/responses",
                {"model": "fake-model", "input": "echo: hi", "store": False},
            )
            assert free.status_code == 200
            assert (await http.get("/health")).status_code == 200
            scraped = await http.get("/metrics")
            assert scraped.status_code == 200  # the server is still watched
            assert "\nmlxcel_store_up 0.0\n" in scraped.text
    finally:
        holder.execute("ROLLBACK")
        holder.close()

    again = await in_thread(client.responses.retrieve, kept.id)
    assert again.model_dump() == kept.model_dump()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        assert "\nmlxcel_store_up 1.0\n" in (await http.get("/metrics")).text
    after = await in_thread(client.responses.create, model="fake-model", input="echo: after")
    assert (await in_thread(client.responses.retrieve, after.id)).id == after.id
