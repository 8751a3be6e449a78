"""The store's encoding of what it keeps: tagged, versioned JSON, the same for every backend.

A stored value (`ResponseRecord`, `Conversation`) and every dataclass inside it (items,
content parts, usage, the request echo) is an object tagged with its class name under
`"$"`; fields equal to their default are left out. The outermost object also carries the
encoding's version under `"v"`, so a later release can read what an earlier one wrote.
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
from typing import Any, Union

from mlxcel import items
from mlxcel.actors.messages import Stored
from mlxcel.items import Conversation, ResponseRecord

VERSION = 1
"""Bump it (and teach `decode` the older form) when a stored class changes shape."""


_TAG = "$"
_CLASSES: dict[str, type[Any]] = {
    cls.__name__: cls
    for cls in vars(items).values()
    if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == items.__name__
}
"""Every dataclass of `mlxcel.items`: the kinds a stored value is built from."""


class CodecError(ValueError):
    """Stored bytes this release cannot read (another version, or damaged)."""


def encode(value: Stored) -> bytes:
    """The value as compact UTF-8 JSON."""
    tree = _encode(value)
    assert isinstance(tree, dict)
    tree["v"] = VERSION
    return json.dumps(tree, ensure_ascii=False, separators=(",", ":")).encode()


def decode(data: bytes | str) -> Stored:
    """The value `encode` was given; CodecError when the bytes are not such a value."""
    try:
        tree = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise CodecError(f"not JSON: {exc}") from None
    if not isinstance(tree, dict) or tree.get("v") != VERSION:
        version = tree.get("v") if isinstance(tree, dict) else None
        raise CodecError(
            f"unknown store encoding version {version!r} (this release reads {VERSION})"
        )
    value = _decode_tagged(tree)
    if not isinstance(value, (ResponseRecord, Conversation)):
        raise CodecError(
            f"a stored value must be a response or a conversation, not {type(value).__name__}"
        )
    return value


def encoded_size(value: Stored) -> int:
    """The bytes the value takes in the store: what the byte budgets charge."""
    return len(encode(value))


def _encode(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        tree: dict[str, object] = {_TAG: type(value).__name__}
        for field in dataclasses.fields(value):
            item = getattr(value, field.name)
            if not _is_default(field, item):
                tree[field.name] = _encode(item)
        return tree
    if isinstance(value, (tuple, list)):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    return value


def _is_default(field: dataclasses.Field[Any], value: object) -> bool:
    if field.default is not dataclasses.MISSING:
        return bool(value == field.default and type(value) is type(field.default))
    if field.default_factory is not dataclasses.MISSING:
        return bool(value == field.default_factory())
    return False


def _decode_tagged(tree: dict[str, Any]) -> object:
    name = tree.get(_TAG)
    cls = _CLASSES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise CodecError(f"unknown stored kind {name!r}")
    hints = _hints(cls)
    kwargs: dict[str, object] = {}
    for key, raw in tree.items():
        if key in (_TAG, "v"):
            continue
        if key not in hints:
            raise CodecError(f"{name} has no field {key!r}")
        kwargs[key] = _decode(hints[key], raw)
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise CodecError(f"{name}: {exc}") from None


_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(cls: type[Any]) -> dict[str, Any]:
    """The class's fields and their resolved annotations (worked out once)."""
    if cls not in _HINTS:
        names = {f.name for f in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls, vars(items))
        _HINTS[cls] = {k: v for k, v in hints.items() if k in names}
    return _HINTS[cls]


def _decode(hint: Any, raw: object) -> object:
    if _is_json(hint):
        return raw  # a client's JSON, kept as it came
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return _decode_union(typing.get_args(hint), raw)
    if isinstance(raw, dict) and _TAG in raw and isinstance(hint, type):
        return _decode_tagged(raw)
    if origin is tuple:
        if not isinstance(raw, list):
            raise CodecError(f"expected a list for {hint}, got {type(raw).__name__}")
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v) for v in raw)
        if len(args) != len(raw):
            raise CodecError(f"expected {len(args)} values for {hint}, got {len(raw)}")
        return tuple(_decode(a, v) for a, v in zip(args, raw, strict=True))
    if origin is dict:
        if not isinstance(raw, dict):
            raise CodecError(f"expected an object for {hint}, got {type(raw).__name__}")
        value_hint = typing.get_args(hint)[1]
        return {k: _decode(value_hint, v) for k, v in raw.items()}
    return raw  # str, int, float, bool, a Literal


@functools.cache
def _is_json(hint: Any) -> bool:
    """`JsonValue` (however far its forward references were resolved) or `Any`: the only
    annotations that allow a list, since the stored dataclasses use tuples."""
    if hint is Any:
        return True
    options = typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else ()
    return any(typing.get_origin(o) is list for o in options)


def _decode_union(options: tuple[Any, ...], raw: object) -> object:
    if raw is None:
        return None
    if isinstance(raw, dict) and _TAG in raw:
        return _decode_tagged(raw)  # an item or a part: its tag says which
    for option in options:
        if option is type(None):
            continue
        origin = typing.get_origin(option)
        if isinstance(raw, list) and origin is tuple:
            return _decode(option, raw)
        if isinstance(raw, dict) and origin is dict:
            return _decode(option, raw)
    return raw
