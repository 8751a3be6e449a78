"""The routes around the Responses API: models named by id, path or folder, the aliases
without `/v1`, `/v1/models` (in OpenAI's shape, or Anthropic's), the root, `/health`
while the model loads, and API keys."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest
import trio

from support import FakeServer, StartServer, in_thread


async def test_unknown_model_is_404_model_not_found(fake_server: FakeServer) -> None:
    client = fake_server.client()
    with pytest.raises(openai.NotFoundError) as info:
        await in_thread(client.responses.create, model="gpt-9", input="hi")
    assert info.value.body["code"] == "model_not_found"  # type: ignore[index]


async def test_model_may_be_named_by_path_or_folder(fake_server: FakeServer) -> None:
    client = fake_server.client()
    for name in ("/models/fake", "fake", "FAKE-MODEL"):
        resp = await in_thread(client.responses.create, model=name, input="echo: y")
        assert resp.output_text == "y"


async def test_aliases_without_v1_and_models_and_health(fake_server: FakeServer) -> None:
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        r = await http.post("/responses", json={"model": "fake-model", "input": "echo: bare"})
        assert r.json()["output"][0]["content"][0]["text"] == "bare"
        for path in ("/models", "/v1/models"):
            data = (await http.get(path)).json()
            assert data["object"] == "list"
            assert [m["id"] for m in data["data"]] == ["fake-model"]
        assert (await http.get("/health")).json()["status"] == "ok"
        missing = await http.get("/v1/nothing-here")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"
        wrong = await http.get("/v1/responses")
        assert wrong.status_code == 405
        assert "error" in wrong.json()


async def test_health_is_503_while_loading(nursery: trio.Nursery) -> None:

    from mlxcel.app import serve
    from mlxcel.config import Settings
    from mlxcel.generation import ModelNames
    from mlxcel.model.fake import fake_factory

    loaded = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def slow_factory():  # type: ignore[no-untyped-def]
        trio.from_thread.run(loaded.wait, trio_token=token)
        return fake_factory()

    urls = await nursery.start(serve, Settings(port=0), slow_factory, ModelNames("m", "m"))
    async with httpx.AsyncClient(base_url=urls[0], timeout=30) as http:
        r = await http.get("/health")
        assert r.status_code == 503
        assert r.json()["models"] == {"m": "loading"}
        answers: list[httpx.Response] = []

        async def ask() -> None:  # a request for a loading model waits for it
            answers.append(await http.post("/v1/responses", json={"model": "m", "input": "hi"}))

        async with trio.open_nursery() as asking:
            asking.start_soon(ask)
            await trio.sleep(0.3)
            assert answers == []
            loaded.set()
        assert answers[0].is_success
        with trio.fail_after(10):
            while (await http.get("/health")).status_code != 200:  # noqa: ASYNC110 - polls as clients do
                await trio.sleep(0.01)
        assert (await http.get("/health")).json()["models"] == {"m": "loaded"}


async def test_api_key_is_required_when_configured(start_fake_server: StartServer) -> None:
    server = await start_fake_server(api_keys=("secret-1", "secret-2"))
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        r = await http.get("/v1/models")
        assert r.status_code == 401
        assert r.json()["error"]["message"]
        r = await http.get("/v1/models", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        r = await http.get("/v1/models", headers={"Authorization": "Bearer secret-2"})
        assert r.status_code == 200
        assert (await http.get("/health")).status_code == 200


async def test_models_in_anthropics_shape_with_anthropic_version(fake_server: FakeServer) -> None:
    client = fake_server.anthropic()
    page = await in_thread(client.models.list)
    [model] = page.data
    assert (model.type, model.id, model.display_name) == ("model", "fake-model", "fake-model")
    assert model.created_at.tzinfo is not None  # RFC 3339, in UTC
    assert (page.has_more, page.first_id, page.last_id) == (False, "fake-model", "fake-model")
    by_name = await in_thread(client.models.retrieve, "FAKE-MODEL")
    assert (by_name.id, by_name.type) == ("FAKE-MODEL", "model")  # as asked
    with pytest.raises(anthropic.NotFoundError) as missing:
        await in_thread(client.models.retrieve, "claude-nowhere")
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert missing.value.request_id is not None
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        openai_shape = (await http.get("/v1/models/fake-model")).json()
        assert openai_shape["object"] == "model"
        assert "request-id" not in (await http.get("/v1/models")).headers


async def test_the_root_answers_clients_that_probe_it(start_fake_server: StartServer) -> None:
    server = await start_fake_server(api_keys=("secret-1",))
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        assert (await http.head("/")).status_code == 200  # without a key
        root = await http.get("/", headers={"anthropic-version": "2023-06-01"})
        assert root.status_code == 200
        assert root.json()["name"] == "mlxcel"
        assert root.headers["request-id"].startswith("req_")
