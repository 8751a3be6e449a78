"""The store's encoding gives back exactly what it was given, for every kind of item and
every stored value, and says `CodecError` for bytes it cannot read."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcel import items
from mlxcel.items import (
    Compaction,
    Conversation,
    FunctionCall,
    FunctionCallOutput,
    InputImage,
    InputText,
    ItemReference,
    Message,
    OutputText,
    Reasoning,
    Refusal,
    RequestEcho,
    ResponseError,
    ResponseRecord,
    TokenLogprob,
    Usage,
)
from mlxcel.store.codec import VERSION, CodecError, decode, encode, encoded_size
from mlxcel.store.tables import Stored

from codec_draws import STRATEGIES, conversations, json_values, response_records, tagged_lookalikes
from store_versions import as_version_1

NOT_STORED = {ItemReference: "a request's input entry, resolved before anything is stored"}


def _dataclasses_of_items() -> set[type[Any]]:
    return {
        cls
        for cls in vars(items).values()
        if isinstance(cls, type)
        and dataclasses.is_dataclass(cls)
        and cls.__module__ == items.__name__
    }


def _reachable(hint: Any, seen: set[type[Any]]) -> None:
    """The dataclasses a value annotated `hint` can hold, added to `seen`."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if hint not in seen:
            seen.add(hint)
            for field_hint in typing.get_type_hints(hint, vars(items)).values():
                _reachable(field_hint, seen)
        return
    for arg in typing.get_args(hint):
        if not isinstance(arg, (str, int, bool, type(Ellipsis))):
            _reachable(arg, seen)


def test_every_dataclass_of_the_items_module_has_a_strategy() -> None:
    assert set(STRATEGIES) | set(NOT_STORED) == _dataclasses_of_items()
    stored: set[type[Any]] = set()
    for kind in typing.get_args(Stored):
        _reachable(kind, stored)
    # What a stored value can hold is exactly what the strategies build ...
    assert stored == set(STRATEGIES)
    # ... and what is not stored really cannot be held by one.
    assert not stored & set(NOT_STORED)


# --- the round trip ------------------------------------------------------------------


def assert_same(decoded: object, original: object, where: str = "value") -> None:
    """Equal, and of the same type all the way down: tuples stay tuples, lists lists,
    ints ints, and the sign of a zero is kept."""
    assert type(decoded) is type(original), f"{where}: {type(decoded)} != {type(original)}"
    if dataclasses.is_dataclass(original):
        for field in dataclasses.fields(original):
            assert_same(
                getattr(decoded, field.name),
                getattr(original, field.name),
                f"{where}.{field.name}",
            )
    elif isinstance(original, (tuple, list)):
        assert isinstance(decoded, (tuple, list))
        assert len(decoded) == len(original), where
        for n, (d, o) in enumerate(zip(decoded, original, strict=True)):
            assert_same(d, o, f"{where}[{n}]")
    elif isinstance(original, dict):
        assert isinstance(decoded, dict)
        assert list(decoded) == list(original), where  # same keys, same order
        for key, value in original.items():
            assert_same(decoded[key], value, f"{where}[{key!r}]")
    elif isinstance(original, float):
        assert isinstance(decoded, float)
        assert decoded == original, where
        assert math.copysign(1, decoded) == math.copysign(1, original), where
    else:
        assert decoded == original, where


def assert_round_trip(value: Stored) -> Stored:
    data = encode(value)
    assert encoded_size(value) == len(data)
    back = decode(data)
    assert back == value
    assert_same(back, value)
    assert decode(data.decode()) == value  # text reads the same as bytes
    return back


@settings(max_examples=300, deadline=None)
@given(response_records)
def test_a_response_record_round_trips(record: ResponseRecord) -> None:
    back = assert_round_trip(record)
    assert isinstance(back, ResponseRecord)
    assert isinstance(back.output, tuple)
    assert isinstance(back.input_items, tuple)
    assert isinstance(back.echo.tools, tuple)
    for tool, sent in zip(back.echo.tools, record.echo.tools, strict=True):
        assert type(tool) is type(sent)  # a client's list stays a list


@settings(max_examples=200, deadline=None)
@given(conversations)
def test_a_conversation_round_trips(conversation: Conversation) -> None:
    back = assert_round_trip(conversation)
    assert isinstance(back, Conversation)
    assert isinstance(back.items, tuple)
    assert isinstance(back.response_ids, tuple)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_every_kind_round_trips_inside_a_stored_value(data: st.DataObject) -> None:
    """Each dataclass, drawn on its own, placed where a stored value holds it."""
    kind = data.draw(st.sampled_from(sorted(STRATEGIES, key=lambda c: c.__name__)))
    value = data.draw(STRATEGIES[kind])
    assert_round_trip(_holding(value))


def _holding(value: object) -> Stored:
    """A stored value with `value` in it."""
    echo = RequestEcho("m")
    match value:
        case ResponseRecord() | Conversation():
            return value
        case RequestEcho():
            return ResponseRecord("r", 0, "completed", value)
        case Usage():
            return ResponseRecord("r", 0, "completed", echo, usage=value)
        case ResponseError():
            return ResponseRecord("r", 0, "failed", echo, error=value)
        case Message() | FunctionCall() | FunctionCallOutput() | Reasoning() | Compaction():
            return Conversation("c", 0, items=(value,))
        case InputText() | OutputText() | Refusal() | InputImage():
            return Conversation("c", 0, items=(Message("user", (value,)),))
        case TokenLogprob():
            part = OutputText("t", (value,))
            return ResponseRecord(
                "r", 0, "completed", echo, output=(Message("assistant", (part,)),)
            )
    raise AssertionError(f"no place for {type(value).__name__}")


@pytest.mark.parametrize(
    "logprob", [float("-inf"), float("inf"), -0.0, 0.0, 5e-324, -1.7976931348623157e308]
)
def test_extreme_logprobs_round_trip(logprob: float) -> None:
    part = OutputText("t", (TokenLogprob("t", logprob, (("u", logprob),)),))
    message = Message("assistant", (part,))
    assert_round_trip(ResponseRecord("r", 0, "completed", RequestEcho("m"), output=(message,)))


def test_a_lone_surrogate_round_trips() -> None:
    record = ResponseRecord("r", 0, "completed", RequestEcho("m", instructions="a\ud800b"))
    assert decode(encode(record)) == record
    assert encoded_size(record) == len(encode(record))


def test_defaults_are_left_out_but_a_value_equal_to_one_of_another_type_is_kept() -> None:
    plain = ResponseRecord("r", 0, "completed", RequestEcho("m"))
    assert json.loads(encode(plain))["echo"] == {"$": "RequestEcho", "model": "m"}
    # 1 == 1.0 and True == 1, but a client's value is kept as it was sent.
    echo = RequestEcho("m", temperature=1, tool_choice=True, text={"format": {"type": "text"}})
    assert_round_trip(ResponseRecord("r", 0, "completed", echo))


# --- what cannot be read -------------------------------------------------------------

VALID = json.loads(encode(ResponseRecord("r", 0, "completed", RequestEcho("m"))))


def _with(**changes: object) -> bytes:
    tree = {**VALID, **changes}
    return json.dumps({k: v for k, v in tree.items() if v is not _DROP}).encode()


_DROP = object()


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(_with(v=VERSION + 1), id="newer-version"),
        pytest.param(_with(v=0), id="version-0"),
        pytest.param(_with(v=1, store=False), id="version-1-with-a-flag-outside-its-echo"),
        pytest.param(
            _with(v=1, echo={"$": "RequestEcho", "model": "m", "background": "yes"}),
            id="version-1-flag-not-a-boolean",
        ),
        pytest.param(
            _with(echo={"$": "RequestEcho", "model": "m", "store": False}), id="flag-in-echo"
        ),
        pytest.param(_with(v=str(VERSION)), id="version-as-text"),
        pytest.param(_with(v=None), id="version-null"),
        pytest.param(_with(v=_DROP), id="no-version"),
        pytest.param(_with(**{"$": "Nope"}), id="unknown-tag"),
        pytest.param(_with(**{"$": _DROP}), id="no-tag"),
        pytest.param(_with(**{"$": ["ResponseRecord"]}), id="tag-not-text"),
        pytest.param(_with(echo={"$": "Nope", "model": "m"}), id="unknown-nested-tag"),
        pytest.param(_with(output=[{"$": "Nope"}]), id="unknown-item-tag"),
        pytest.param(_with(**{"$": "Usage"}), id="not-a-stored-kind"),
        pytest.param(_with(nope=1), id="unknown-field"),
        pytest.param(_with(id=_DROP), id="missing-field"),
        pytest.param(_with(output={"a": 1}), id="tuple-not-a-list"),
        pytest.param(_with(v=True), id="version-as-true"),
        pytest.param(_with(v=1.0), id="version-as-float"),
        pytest.param(_with(echo="x"), id="echo-not-an-object"),
        pytest.param(_with(echo={"$": "Usage"}), id="echo-of-another-kind"),
        pytest.param(_with(output=[{"$": "Usage"}]), id="an-output-that-is-no-item"),
        pytest.param(_with(id=7), id="id-not-text"),
        pytest.param(_with(created_at="0"), id="time-not-a-number"),
        pytest.param(_with(created_at=True), id="time-a-boolean"),
        pytest.param(_with(status="done"), id="status-unknown"),
        pytest.param(_with(usage="none"), id="usage-not-an-object"),
        pytest.param(b"", id="empty"),
        pytest.param(b"{", id="truncated"),
        pytest.param(encode(ResponseRecord("r", 0, "completed", RequestEcho("m")))[:-1], id="cut"),
        pytest.param(b"\xff\xfe{}", id="not-utf8"),
        pytest.param(b"NaN", id="bare-nan"),
        pytest.param(b"[" * 100_000, id="nested-past-the-stack"),
        pytest.param(b'{"a":' * 100_000, id="objects-nested-past-the-stack"),
        pytest.param(b"[1, 2]", id="a-list"),
        pytest.param(b"null", id="null"),
        pytest.param(b'"text"', id="a-string"),
    ],
)
def test_unreadable_bytes_are_a_codec_error(data: bytes) -> None:
    with pytest.raises(CodecError):
        decode(data)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_damaged_encodings_decode_or_are_a_codec_error(data: st.DataObject) -> None:
    """A real encoding with one value swapped for arbitrary JSON: `decode` gives a value
    or says CodecError, never another exception."""
    value = data.draw(st.one_of(response_records, conversations))
    tree = json.loads(encode(value))
    node: Any = tree
    path = []
    while isinstance(node, (dict, list)) and node and data.draw(st.booleans()):
        key = data.draw(
            st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node)))
        )
        path.append(key)
        if not isinstance(node[key], (dict, list)) or not node[key]:
            break
        node = node[key]
    if path:
        parent: Any = tree
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = data.draw(json_values | tagged_lookalikes)
    with contextlib.suppress(CodecError):
        decode(json.dumps(tree))


def test_a_record_without_a_tenant_encodes_as_before_and_one_with_a_tenant_keeps_it() -> None:
    record = ResponseRecord("resp_1", 0, "completed", RequestEcho("m"))
    # One tenant (no API keys): the encoding is the one earlier releases wrote and read.
    assert b"tenant" not in encode(record)
    owned = dataclasses.replace(record, tenant="key-a")
    assert decode(encode(owned)) == owned
    assert decode(encode(record)) == record


# --- what earlier releases wrote -----------------------------------------------------

VERSION_1 = (
    b'{"$":"ResponseRecord","id":"resp_old","created_at":1700000000,"status":"completed",'
    b'"echo":{"$":"RequestEcho","model":"fake-model","store":false,"background":true,'
    b'"metadata":{"k":"v"},"previous_response_id":"resp_prev"},"output":[{"$":"Message",'
    b'"role":"assistant","content":[{"$":"OutputText","text":"hello"}],"id":"msg_old"}],'
    b'"usage":{"$":"Usage","input_tokens":3,"output_tokens":1},"completed_at":1700000001,'
    b'"tenant":"key-a","v":1}'
)
"""A background `store: false` response as the previous release encoded it: the flags in
its echo."""


def test_a_version_1_record_reads_with_its_flags_on_the_record() -> None:
    record = decode(VERSION_1)
    assert isinstance(record, ResponseRecord)
    assert (record.store, record.background) == (False, True)
    assert record.echo == RequestEcho(
        "fake-model", metadata={"k": "v"}, previous_response_id="resp_prev"
    )
    assert (record.output_text, record.tenant, record.completed_at) == (
        "hello",
        "key-a",
        1700000001,
    )
    # Written again, it is this version's shape, the same length (budgets stay right).
    tree = json.loads(encode(record))
    assert tree["v"] == VERSION == 2
    assert (tree["store"], tree["background"]) == (False, True)
    assert "store" not in tree["echo"]
    assert "background" not in tree["echo"]
    assert encoded_size(record) == len(VERSION_1)
    assert decode(encode(record)) == record


def test_a_version_1_record_without_flags_has_the_defaults() -> None:
    plain = b'{"$":"ResponseRecord","id":"r","created_at":0,"status":"queued",'
    plain += b'"echo":{"$":"RequestEcho","model":"m"},"v":1}'
    record = decode(plain)
    assert isinstance(record, ResponseRecord)
    assert (record.store, record.background) == (True, False)
    conversation = b'{"$":"Conversation","id":"c","created_at":0,"metadata":{"store":"x"},"v":1}'
    assert decode(conversation) == Conversation("c", 0, metadata={"store": "x"})


@settings(max_examples=200, deadline=None)
@given(response_records)
def test_any_record_as_version_1_wrote_it_reads_the_same(record: ResponseRecord) -> None:
    """The previous release's encoding, made by hand from this one's: the flags (left out
    at their defaults) inside the echo, version 1."""
    old = as_version_1(encode(record))
    assert json.loads(old)["v"] == 1
    assert_same(decode(old), record)
    assert len(old) == encoded_size(record)  # what the byte budgets counted stays right


@pytest.mark.parametrize("version", [0, 3, -1, 2**70])
def test_an_unknown_version_is_a_codec_error_naming_what_is_read(version: int) -> None:
    with pytest.raises(CodecError, match=rf"version {version} \(this release reads 1, 2\)"):
        decode(_with(v=version))
