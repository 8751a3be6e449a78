"""Loading and unloading models over real HTTP (the `openai` SDK's raw `post`, httpx for
the body forms) on the fake engine: on a server with keys only an admin key may, from
the keys file (`admin=true`) or `--admin-key`; an ordinary key gets 403
`permission_denied` on each of the four routes and nothing is unloaded; without keys the
routes stay open; an admin's calls are rate limited; each call has one log line naming
the key, never showing it. Afterwards `/health` answers and an ordinary request
completes."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
import trio

from support import FakeServer, KeysFile, StartServer, an_ordinary_request_completes, in_thread

MODEL = "fake-model"
ORDINARY, ADMIN, FLAG_ADMIN = "sk-tenant-7c1e", "sk-root-41b9", "sk-ops-d20f"
ROUTES = (
    ("/v1/models/fake-model/unload", None),
    ("/v1/models/unload", {"model": MODEL}),
    ("/v1/models/fake-model/load", None),
    ("/models/load", {"model": MODEL}),
)
"""The four model-management routes (each with and without `/v1`), unload first."""


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def call(server: FakeServer, key: str | None, path: str, body: Any) -> httpx.Response:
    headers = auth(key) if key else {}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        return await http.post(path, json=body, headers=headers)


async def state(server: FakeServer, key: str | None = None) -> str:
    headers = auth(key) if key else {}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        r = await http.get(f"/v1/models/{MODEL}", headers=headers)
    assert r.status_code == 200, r.text
    return str(r.json()["state"])


def sdk_unload(server: FakeServer, key: str) -> Any:
    """The SDK's own request machinery on the unload route (it has no method for it)."""
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0) as client:
        return client.post(f"/models/{MODEL}/unload", cast_to=httpx.Response)


async def still_serving(server: FakeServer, key: str) -> None:
    """`/health` answers and a keyed request completes."""
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        with trio.fail_after(15):
            assert (await http.get("/health")).status_code == 200
            r = await http.post(
                "/v1/responses", json={"model": MODEL, "input": "echo: fine"}, headers=auth(key)
            )
    assert r.status_code == 200, r.text
    assert r.json()["output"][0]["content"][0]["text"] == "fine"


async def test_an_ordinary_key_may_neither_load_nor_unload(
    start_fake_server: StartServer, caplog: pytest.LogCaptureFixture
) -> None:
    server = await start_fake_server(api_keys=(ORDINARY,), rate_limit_rpm=1)
    with pytest.raises(openai.PermissionDeniedError) as refused:
        await in_thread(sdk_unload, server, ORDINARY)
    assert refused.value.code == "permission_denied"
    for path, body in ROUTES:
        r = await call(server, ORDINARY, path, body)
        assert r.status_code == 403, (path, r.text)
        error = r.json()["error"]
        assert (error["type"], error["code"], error["param"]) == (
            "permission_denied",
            "permission_denied",
            None,
        ), path
        assert "admin" in error["message"]
    assert await state(server, ORDINARY) == "loaded"  # nothing was unloaded
    assert (await call(server, None, *ROUTES[0])).status_code == 401  # no key at all
    assert await state(server, ORDINARY) == "loaded"
    refusals = [r.getMessage() for r in caplog.records if r.name == "mlxcel.admin"]
    assert len(refusals) == 5  # one line a call (the 401s never reached the route)
    assert all("refused=permission_denied" in line for line in refusals)
    assert ORDINARY not in caplog.text
    await still_serving(server, ORDINARY)  # its one request a minute was never spent


async def test_admin_keys_from_the_file_and_the_flag_load_and_unload(
    start_fake_server: StartServer, keys_file: KeysFile, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="mlxcel.admin")
    path = keys_file(f"root:{ADMIN} admin=true\ntenant:{ORDINARY} admin=false\n")
    server = await start_fake_server(api_key_file=path, admin_keys=(FLAG_ADMIN,))
    for key, (route, body) in zip((ADMIN, FLAG_ADMIN, ADMIN, FLAG_ADMIN), ROUTES, strict=True):
        r = await call(server, key, route, body)
        assert r.status_code == 200, r.text
        assert r.json()["state"] == ("unloaded" if "unload" in route else "loaded")
    raw = await in_thread(sdk_unload, server, ADMIN)
    assert raw.json()["state"] == "unloaded"
    assert (await call(server, ORDINARY, *ROUTES[2])).status_code == 403  # admin=false
    assert await state(server, ORDINARY) == "unloaded"
    assert (await call(server, FLAG_ADMIN, *ROUTES[2])).status_code == 200
    nowhere = await call(server, ADMIN, "/v1/models/unload", {"model": "no\nsuch=model"})
    assert nowhere.status_code == 404
    assert nowhere.json()["error"]["code"] == "model_not_found"
    lines = [r.getMessage() for r in caplog.records if r.name == "mlxcel.admin"]
    assert lines[0] == f"key=root action=unload model={MODEL}"
    assert lines[1].startswith("key=key-")
    assert lines[1].endswith(f"action=unload model={MODEL}")
    assert f"key=tenant action=load model={MODEL} refused=permission_denied" in lines
    assert lines[-1] == "key=root action=unload model=-"  # a client's name is not logged
    assert len(lines) == 8
    for secret in (ADMIN, FLAG_ADMIN, ORDINARY):
        assert secret not in caplog.text
    await still_serving(server, ORDINARY)


async def test_without_keys_the_routes_stay_open(fake_server: FakeServer) -> None:
    for path, body in ROUTES:
        r = await call(fake_server, None, path, body)
        assert r.status_code == 200, r.text
    assert await state(fake_server) == "loaded"
    await an_ordinary_request_completes(fake_server)


async def test_an_admins_calls_are_rate_limited(
    start_fake_server: StartServer, mock_clock: trio.testing.MockClock
) -> None:
    server = await start_fake_server(
        api_keys=(ORDINARY,), admin_keys=(ADMIN,), admin_rate_limit_rpm=2
    )
    assert (await call(server, ADMIN, *ROUTES[0])).status_code == 200
    assert (await call(server, ADMIN, *ROUTES[2])).status_code == 200
    refused = await call(server, ADMIN, *ROUTES[1])
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(refused.headers["retry-after"]) <= 30  # one call comes back in 30 s
    with pytest.raises(openai.RateLimitError):
        await in_thread(sdk_unload, server, ADMIN)
    assert await state(server, ADMIN) == "loaded"  # the refused unloads did nothing
    mock_clock.jump(30)
    assert (await call(server, ADMIN, *ROUTES[1])).status_code == 200
    assert (await call(server, ADMIN, *ROUTES[2])).status_code == 429
    await still_serving(server, ORDINARY)  # ordinary requests are not held by it
