"""No tenant learns from `cached_tokens` what another sent: the server on the tiny model,
two API keys, over real HTTP with the `openai` SDK."""

from __future__ import annotations

import functools

import httpx
import pytest
import trio

from mlxcel.app import serve
from mlxcel.cli.serve import load_model
from mlxcel.config import Settings
from mlxcel.generation import ModelNames

from support import in_thread
from tiny_model import ensure_tiny_model

pytestmark = pytest.mark.mlx

KEYS = ("key-a", "key-b")


async def test_a_tenant_never_sees_another_tenants_prompt_cached(nursery: trio.Nursery) -> None:
    from openai import OpenAI

    path = ensure_tiny_model()
    names = ModelNames("tiny", str(path))
    settings = Settings(port=0, api_keys=KEYS, parallel=2, prompt_cache_bytes=1 << 26)
    factory = functools.partial(load_model, path, names, settings)
    urls = await nursery.start(serve, settings, factory, names)
    async with httpx.AsyncClient(base_url=urls[0], timeout=5) as http:
        with trio.fail_after(120):  # loading the tiny model takes a second or two
            while (await http.get("/health")).status_code != 200:  # noqa: ASYNC110 - not ours to signal
                await trio.sleep(0.05)
    a, b = (OpenAI(base_url=f"{urls[0]}/v1", api_key=key, max_retries=0) for key in KEYS)
    prompt = "Summarise the following notes for the team. " * 20

    async def cached(client: OpenAI) -> int:
        resp = await in_thread(
            client.responses.create,
            model="tiny",
            input=prompt,
            max_output_tokens=4,
            temperature=0,
        )
        assert resp.usage is not None
        return resp.usage.input_tokens_details.cached_tokens

    try:
        assert await cached(a) == 0
        assert await cached(b) == 0  # the very same prompt: nothing of A's is reused
        assert await cached(a) > 0  # A's own repeat is served from A's entries
        assert await cached(b) > 0  # and B's from B's
    finally:
        a.close()
        b.close()
