"""Browser safety: no CORS headers unless `--cors-origins` lists the page's origin, then
preflights answered (before the API key, which browsers do not send on them) and answers
readable; a loopback-bound server refuses a `Host` that is not a loopback name (DNS
rebinding), a server bound to every address does not look at `Host`."""

from __future__ import annotations

import httpx
import pytest

from support import FakeServer, StartServer

BODY = {"model": "fake-model", "input": "hi"}
SDK_HEADERS = (
    "authorization, content-type, x-stainless-os, x-stainless-retry-count, openai-project, "
    "x-api-key, anthropic-version, anthropic-dangerous-direct-browser-access"
)


def assert_openai_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert error["code"] == code


def cors_headers(response: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.startswith("access-control-")}


def preflight(origin: str) -> dict[str, str]:
    return {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": SDK_HEADERS,
    }


async def test_without_cors_origins_no_cors_header_is_sent(fake_server: FakeServer) -> None:
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        origin = {"Origin": "https://app.example"}
        r = await http.post("/v1/responses", json=BODY, headers=origin)
        assert r.status_code == 200
        assert not cors_headers(r)
        r = await http.options("/v1/responses", headers=preflight("https://app.example"))
        assert not cors_headers(r)


async def test_listed_origins_get_preflights_and_readable_answers(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(
        cors_origins=("https://app.example", "http://localhost:5173"), api_keys=("sk-cors",)
    )
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        r = await http.options("/v1/responses", headers=preflight("https://app.example"))
        assert r.status_code == 204  # no key needed: browsers send none on a preflight
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        methods = {m.strip() for m in r.headers["access-control-allow-methods"].split(",")}
        assert {"GET", "POST", "DELETE", "OPTIONS"} <= methods
        allowed = {h.strip() for h in r.headers["access-control-allow-headers"].split(",")}
        assert {h.strip() for h in SDK_HEADERS.split(",")} <= allowed
        assert "Origin" in r.headers["vary"]

        r = await http.options("/v1/responses", headers=preflight("https://evil.example"))
        assert r.status_code == 204
        assert not cors_headers(r)

        key = {"Authorization": "Bearer sk-cors"}
        for origin in ("https://app.example", "http://localhost:5173"):
            r = await http.post("/v1/responses", json=BODY, headers={**key, "Origin": origin})
            assert r.status_code == 200, r.text
            assert r.headers["access-control-allow-origin"] == origin
            exposed = {h.strip() for h in r.headers["access-control-expose-headers"].split(",")}
            # A page can read when to retry, and the key's rate limits.
            assert {"retry-after", "x-ratelimit-remaining-requests"} <= exposed
            assert "x-ratelimit-reset-tokens" in exposed
        r = await http.post("/v1/responses", json=BODY, headers={"Origin": "https://app.example"})
        assert_openai_error(r, 401, "invalid_api_key")  # errors are readable too
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        r = await http.post(
            "/v1/responses", json=BODY, headers={**key, "Origin": "https://evil.example"}
        )
        assert r.status_code == 200
        assert not cors_headers(r)


async def test_any_origin_with_a_star(start_fake_server: StartServer) -> None:
    server = await start_fake_server(cors_origins=("*",))
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        r = await http.options("/v1/responses", headers=preflight("https://any.example"))
        assert r.status_code == 204
        assert r.headers["access-control-allow-origin"] == "*"
        r = await http.get("/v1/models", headers={"Origin": "https://any.example"})
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "*"


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:8080",
        "127.0.0.1.evil.example",
        "10.0.0.1",
        "[::1]evil.com",
        "[::1]:80evil.com",
        "localhost..",
    ],
)
async def test_a_loopback_server_refuses_other_host_names(
    fake_server: FakeServer, host: str
) -> None:
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        for path in ("/health", "/v1/models"):
            assert_openai_error(
                await http.get(path, headers={"Host": host}), 403, "host_not_allowed"
            )
        r = await http.post("/v1/responses", json=BODY, headers={"Host": host})
        assert_openai_error(r, 403, "host_not_allowed")
        names = ("localhost", "LOCALHOST:1234", "127.0.0.1", "[::1]:8080", "[::1]", "localhost.")
        for name in (*names, "localhost.:8080"):
            r = await http.post("/v1/responses", json=BODY, headers={"Host": name})
            assert r.status_code == 200, (name, r.text)


async def test_a_server_on_every_address_does_not_check_the_host(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(host="0.0.0.0")
    port = server.url.rsplit(":", 1)[1]
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        r = await http.post("/v1/responses", json=BODY, headers={"Host": "api.example"})
        assert r.status_code == 200, r.text


async def test_a_preflight_echoes_only_header_names_that_are_tokens(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(cors_origins=("https://app.example",))
    asked = 'x-stainless-ok, x-stainless-a b, openai-x"y, openai-(z), x-stainless-\u00e9'
    headers = {**preflight("https://app.example"), "Access-Control-Request-Headers": asked}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        r = await http.options(
            "/v1/responses",
            headers={k: v.encode("utf-8") for k, v in headers.items()},
        )
    assert r.status_code == 204
    allowed = [h.strip() for h in r.headers["access-control-allow-headers"].split(",")]
    assert "x-stainless-ok" in allowed
    assert not [
        h for h in allowed if h.startswith(("x-stainless-", "openai-")) and h != "x-stainless-ok"
    ]
