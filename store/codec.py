"""The store's encoding of what it keeps: tagged, versioned JSON, the same for every backend.

A stored value (`ResponseRecord`, `Conversation`) and every dataclass inside it (items,
content parts, usage, the request echo) is an object tagged with its class name under
`"$"`; fields equal to their default are left out. The outermost object also carries the
encoding's version under `"v"`, so a later release can read what an earlier one wrote:
`decode` takes an earlier version's tree to this one's shape first (`_UPGRADES`).
Decoding follows the dataclasses' annotations: a tuple field comes back a tuple, a
client's JSON (`JsonValue`, such as tool schemas) comes back exactly as it was, whatever
keys it uses. The byte budgets charge the encoded length.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union

from mlxcel import items
from mlxcel.items import Conversation, ResponseRecord
from mlxcel.store.tables import Stored

VERSION = 2
"""Bump it (and teach `decode` the older form, `_UPGRADES`) when a stored class changes
shape. Version 2 moved `store` and `background` from a record's echo onto the record."""


_TAG = "$"
_CLASSES: dict[str, type[Any]] = {
    cls.__name__: cls
    for cls in vars(items).values()
    if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == items.__name__
}
"""Every dataclass of `mlxcel.items`: the kinds a stored value is built from."""
_KINDS = frozenset(_CLASSES.values())


class CodecError(ValueError):
    """Stored bytes this release cannot read (another version, or damaged)."""


_FLAGS = ("store", "background")
"""What version 1 kept in a record's echo and version 2 keeps on the record."""


def _from_version_1(tree: dict[str, Any]) -> None:
    """A version 1 record's flags moved from its echo onto it (absent ones stay absent:
    their defaults did not change); a conversation is unchanged."""
    echo = tree.get("echo")
    if tree.get(_TAG) != "ResponseRecord" or not isinstance(echo, dict):
        return  # a conversation, or damage the decoding below names
    for name in _FLAGS:
        if name in tree:
            raise CodecError(f"a version 1 ResponseRecord has no field {name!r}")
        if name in echo:
            tree[name] = echo.pop(name)


_UPGRADES: dict[int, Callable[[dict[str, Any]], None]] = {1: _from_version_1}
"""What takes the tree of version n to version n + 1, in place, before it is decoded."""
_READS = ", ".join(str(v) for v in (*sorted(_UPGRADES), VERSION))


def encode(value: Stored) -> bytes:
    """The value as compact UTF-8 JSON."""
    tree = _encode(value)
    assert isinstance(tree, dict)
    tree["v"] = VERSION
    text = json.dumps(tree, ensure_ascii=False, separators=(",", ":"))
    # A lone surrogate (the HTTP edge refuses them, but a value may come from elsewhere)
    # is kept as it is: `json.loads` reads bytes back the same way.
    return text.encode("utf-8", "surrogatepass")


def decode(data: bytes | str) -> Stored:
    """The value `encode` was given; CodecError when the bytes are not such a value."""
    try:
        tree = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise CodecError(f"not JSON: {exc}") from None
    version = tree.get("v") if isinstance(tree, dict) else None
    if type(version) is not int or not (version == VERSION or version in _UPGRADES):
        raise CodecError(
            f"unknown store encoding version {version!r} (this release reads {_READS})"
        )
    for older in range(version, VERSION):
        _UPGRADES[older](tree)  # each in turn: the tree of version n + 1
    value = _decode_tagged(tree)
    if not isinstance(value, (ResponseRecord, Conversation)):
        raise CodecError(
            f"a stored value must be a response or a conversation, not {type(value).__name__}"
        )
    return value


def decode_record(data: bytes | str) -> ResponseRecord:
    """A stored response read back; CodecError when the bytes are not one (a conversation
    where a response belongs is damage too)."""
    value = decode(data)
    if not isinstance(value, ResponseRecord):
        raise CodecError(f"a response's entry holds a {type(value).__name__}")
    return value


def encoded_size(value: Stored) -> int:
    """The bytes the value takes in the store: what the byte budgets charge."""
    return len(encode(value))


_REQUIRED = object()
Decoder = Callable[[object], object]


_DEFAULTS: dict[type[Any], tuple[tuple[str, object], ...]] = {}
_FIELD_DECODERS: dict[type[Any], dict[str, Decoder]] = {}


def _defaults(cls: type[Any]) -> tuple[tuple[str, object], ...]:
    """Each field's name and default value (`_REQUIRED` when it has none), read once."""
    if cls in _DEFAULTS:
        return _DEFAULTS[cls]
    found: list[tuple[str, object]] = []
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            found.append((field.name, field.default))
        elif field.default_factory is not dataclasses.MISSING:
            found.append((field.name, field.default_factory()))
        else:
            found.append((field.name, _REQUIRED))
    _DEFAULTS[cls] = tuple(found)
    return _DEFAULTS[cls]


def _encode(value: object) -> object:
    cls = type(value)
    if cls in _KINDS:
        tree: dict[str, object] = {_TAG: cls.__name__}
        for name, default in _defaults(cls):
            item = getattr(value, name)
            if default is _REQUIRED or type(item) is not type(default) or item != default:
                tree[name] = _encode(item)
        return tree
    if cls is tuple or cls is list:
        return [_encode(v) for v in value]  # type: ignore[attr-defined]
    if cls is dict:
        return {k: _encode(v) for k, v in value.items()}  # type: ignore[attr-defined]
    return value


def _decode_tagged(raw: object) -> object:
    if not isinstance(raw, dict):
        raise CodecError(f"expected a tagged object, got {type(raw).__name__}")
    name = raw.get(_TAG)
    cls = _CLASSES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise CodecError(f"unknown stored kind {name!r}")
    fields = _field_decoders(cls)
    kwargs: dict[str, object] = {}
    for key, value in raw.items():
        if key == _TAG or key == "v":
            continue
        decoder = fields.get(key)
        if decoder is None:
            raise CodecError(f"{name} has no field {key!r}")
        kwargs[key] = decoder(value)
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise CodecError(f"{name}: {exc}") from None


def _field_decoders(cls: type[Any]) -> dict[str, Decoder]:
    """A decoder for each field of the class, from its resolved annotation (once)."""
    if cls not in _FIELD_DECODERS:
        names = {f.name for f in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls, vars(items))
        _FIELD_DECODERS[cls] = {k: _decoder(v) for k, v in hints.items() if k in names}
    return _FIELD_DECODERS[cls]


def _decoder(hint: Any) -> Decoder:
    """How a value annotated `hint` comes back from JSON, worked out once per field."""
    if _is_json(hint):
        return _as_is  # a client's JSON, kept as it came
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return _union_decoder(typing.get_args(hint))
    if isinstance(hint, type) and hint in _KINDS:
        return _kind_decoder((hint,))
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            each = _decoder(args[0])
            return lambda raw: tuple(each(v) for v in _list(raw))
        parts = [_decoder(a) for a in args]

        def fixed(raw: object) -> object:
            values = _list(raw)
            if len(values) != len(parts):
                raise CodecError(f"expected {len(parts)} values, got {len(values)}")
            return tuple(d(v) for d, v in zip(parts, values, strict=True))

        return fixed
    if origin is dict:
        value = _decoder(typing.get_args(hint)[1])
        return lambda raw: {k: value(v) for k, v in _dict(raw).items()}
    return _scalar_decoder(hint)


def _union_decoder(options: tuple[Any, ...]) -> Decoder:
    """An optional value, an item or part of several kinds (its tag says which), or a
    tuple, mapping or plain value that may be absent."""
    kinds = tuple(o for o in options if isinstance(o, type) and o in _KINDS)
    tagged = _kind_decoder(kinds) if kinds else None
    sequence = next((_decoder(o) for o in options if typing.get_origin(o) is tuple), None)
    mapping = next((_decoder(o) for o in options if typing.get_origin(o) is dict), None)
    scalars = [
        _scalar_decoder(o)
        for o in options
        if o is not type(None) and (o not in kinds) and typing.get_origin(o) not in (tuple, dict)
    ]
    optional = type(None) in options

    def decode_one(raw: object) -> object:
        if raw is None and optional:
            return None
        if isinstance(raw, dict):
            decoder = tagged if _TAG in raw else mapping
        elif isinstance(raw, list):
            decoder = sequence
        else:
            for scalar in scalars:
                try:
                    return scalar(raw)
                except CodecError:
                    continue
            decoder = None
        if decoder is None:
            raise CodecError(f"{type(raw).__name__} is none of {options}")
        return decoder(raw)

    return decode_one


def _kind_decoder(kinds: tuple[type[Any], ...]) -> Decoder:
    """A tagged object that must be one of `kinds`."""

    def decode_kind(raw: object) -> object:
        value = _decode_tagged(raw)
        if not isinstance(value, kinds):
            raise CodecError(f"{type(value).__name__} where {kinds} belongs")
        return value

    return decode_kind


def _scalar_decoder(hint: Any) -> Decoder:
    """A str, int, float or bool field (an int is a float's value too), or a Literal."""
    if typing.get_origin(hint) is Literal:
        allowed = typing.get_args(hint)

        def literal(raw: object) -> object:
            if raw not in allowed or isinstance(raw, bool):
                raise CodecError(f"{raw!r} is none of {allowed}")
            return raw

        return literal
    accepted: tuple[type, ...] = (int, float) if hint is float else (hint,)

    def scalar(raw: object) -> object:
        if not isinstance(raw, accepted) or (isinstance(raw, bool) and hint is not bool):
            raise CodecError(f"expected {getattr(hint, '__name__', hint)}, got {raw!r:.40}")
        return raw

    return scalar


def _as_is(raw: object) -> object:
    return raw


def _list(raw: object) -> list[object]:
    if not isinstance(raw, list):
        raise CodecError(f"expected a list, got {type(raw).__name__}")
    return raw


def _dict(raw: object) -> dict[str, object]:
    if not isinstance(raw, dict):
        raise CodecError(f"expected an object, got {type(raw).__name__}")
    return raw


@functools.cache
def _is_json(hint: Any) -> bool:
    """`JsonValue` (however far its forward references were resolved) or `Any`: the only
    annotations that allow a list, since the stored dataclasses use tuples."""
    if hint is Any:
        return True
    options = typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else ()
    return any(typing.get_origin(o) is list for o in options)
