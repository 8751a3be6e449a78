"""The front door of preparation on the fake engine's model: each call from parameters
and the served model to the one command its route submits (no HTTP)."""

from __future__ import annotations

import pytest
import trio

from mlxcel.config import Settings, StoreLimits
from mlxcel.errors import ContextLengthExceeded, InvalidRequest
from mlxcel.generation import ModelNames, ServedModel
from mlxcel.items import InputText, Item, Message, OutputText
from mlxcel.model.fake import fake_factory
from mlxcel.prepare.chat_messages import to_chat
from mlxcel.prepare.compaction import rendered_tokens
from mlxcel.prepare.context_management import CompactionPrelude
from mlxcel.prepare.front import (
    input_token_count,
    prepare_chat,
    prepare_compaction,
    prepare_response,
)
from mlxcel.prepare.params import CompactionParams, ResponseParams
from mlxcel.prepare.policy import ClientPolicy
from mlxcel.store import StoreActor, StoreHandle

POLICY = ClientPolicy()


def served(context_length: int = 4096) -> ServedModel:
    loaded = fake_factory(context_length=context_length)
    return ServedModel(ModelNames("fake-model", "/models/fake"), loaded.info, loaded.codec)


def user(text: str) -> Message:
    return Message("user", (InputText(text),))


def assistant(text: str) -> Message:
    return Message("assistant", (OutputText(text),))


async def open_store(nursery: trio.Nursery) -> StoreHandle:
    limits = StoreLimits(100, 1 << 20, 0)
    ttl = Settings().background_ephemeral_ttl_secs
    store: StoreHandle = await nursery.start(StoreActor(limits, limits, ttl).run)
    return store


async def test_a_responses_request_samples_with_the_penalties_it_echoes(
    nursery: trio.Nursery,
) -> None:
    store, model = await open_store(nursery), served()
    params = ResponseParams(
        "fake-model", (user("hello"),), presence_penalty=0.5, frequency_penalty=-1.0
    )
    request = await prepare_response(params, model, policy=POLICY, store=store, echo=store.echo)
    sampling, echo = request.sampling, request.record.echo
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (0.5, -1.0)
    assert (echo.presence_penalty, echo.frequency_penalty) == (0.5, -1.0)


async def test_a_response_is_rendered_from_its_input_for_its_tenant(
    nursery: trio.Nursery,
) -> None:
    store, model = await open_store(nursery), served()
    params = ResponseParams("fake-model", (user("hello"),), instructions="Be brief.", tenant="t1")
    request = await prepare_response(params, model, policy=POLICY, store=store, echo=store.echo)
    expected = model.codec.render(to_chat("Be brief.", params.input), None)
    assert request.prompt == tuple(expected)
    assert request.record.input_items == params.input
    assert request.record.tenant == "t1"
    assert request.record.echo.model == "fake-model"
    assert request.prelude is None
    count = await input_token_count(params, model, policy=POLICY, store=store, echo=store.echo)
    assert count == len(request.prompt)


async def test_a_response_continuing_an_unknown_one_is_a_400(nursery: trio.Nursery) -> None:
    store = await open_store(nursery)
    params = ResponseParams("fake-model", (user("hello"),), previous_response_id="resp_gone")
    with pytest.raises(InvalidRequest) as caught:
        await prepare_response(params, served(), policy=POLICY, store=store, echo=store.echo)
    assert caught.value.code == "previous_response_not_found"


async def test_a_response_over_its_threshold_compacts_in_its_slot_first(
    nursery: trio.Nursery,
) -> None:
    store = await open_store(nursery)
    turns = (user("one " * 40), assistant("two " * 40), user("three"))
    params = ResponseParams("fake-model", turns, compact_threshold=100)
    request = await prepare_response(params, served(), policy=POLICY, store=store, echo=store.echo)
    assert isinstance(request.prelude, CompactionPrelude)
    assert request.prelude.identity == (request.record.id, request.record.created_at)


async def test_a_raw_completion_is_its_text_encoded(nursery: trio.Nursery) -> None:
    store, model = await open_store(nursery), served()
    params = ResponseParams("fake-model", (user("Once upon"),), raw=True, store=False)
    request = await prepare_chat(params, model, policy=POLICY, echo=store.echo)
    assert request.prompt == tuple(model.codec.encode("Once upon"))


async def test_a_compaction_measures_its_history(nursery: trio.Nursery) -> None:
    store, model = await open_store(nursery), served()
    items: tuple[Item, ...] = (user("hi"), assistant("hello"), user("go on"))
    params = CompactionParams("fake-model", items, keep_tokens=8, tenant="t1")
    compaction = await prepare_compaction(params, model, store)
    assert compaction.items == items
    assert compaction.tokens_before == rendered_tokens(model.codec, items)
    assert (compaction.keep_tokens, compaction.tenant) == (8, "t1")


async def test_a_compaction_that_cannot_fit_is_refused_before_any_summary(
    nursery: trio.Nursery,
) -> None:
    store, model = await open_store(nursery), served(context_length=64)
    with pytest.raises(InvalidRequest) as caught:
        await prepare_compaction(
            CompactionParams("fake-model", (user("hi"),), keep_tokens=64), model, store
        )
    assert caught.value.param == "keep_tokens"
    with pytest.raises(ContextLengthExceeded):
        await prepare_compaction(CompactionParams("fake-model", (user("x" * 80),)), model, store)
