"""Response objects checked field by field against the `openai` SDK's types.

The SDK builds what it parses without validating it (`construct`), so a client using it
never notices a missing field; a client that validates every object against the API's
schemas does. `checked_response` is such a client: the raw JSON must validate as the
SDK's `Response`, every field the SDK's types require must be present at every level
(no default, or a type that does not take `None`), and so must the fields the API
documents beyond this SDK's model (`presence_penalty`, `frequency_penalty`,
`background`) and every function tool's `strict`.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from openai.types.responses import CompactedResponse, Response, ResponseItem
from pydantic import BaseModel, TypeAdapter
from pydantic.fields import FieldInfo

DOCUMENTED: dict[str, tuple[type, ...]] = {
    "presence_penalty": (int, float),
    "frequency_penalty": (int, float),
    "background": (bool,),
}
"""Fields of the API's response object that every object carries, with their JSON types."""
ITEM: TypeAdapter[ResponseItem] = TypeAdapter(ResponseItem)


def _takes_none(annotation: Any) -> bool:
    if annotation is None or annotation is type(None):
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_takes_none(arg) for arg in typing.get_args(annotation))
    return False


def required_fields(model: type[BaseModel]) -> list[str]:
    """The JSON names of `model`'s fields a valid object cannot leave out."""
    return [
        _json_name(name, info)
        for name, info in model.model_fields.items()
        if info.is_required() or not _takes_none(info.annotation)
    ]


def _json_name(name: str, info: FieldInfo) -> str:
    return info.alias or name


def missing_fields(value: object, raw: object, where: str = "") -> list[str]:
    """Where `raw` lacks a field its parsed `value`'s type requires, at any depth."""
    if isinstance(value, BaseModel) and isinstance(raw, dict):
        missing = [f"{where}.{n}" for n in required_fields(type(value)) if n not in raw]
        for name, info in type(value).model_fields.items():
            key = _json_name(name, info)
            if key in raw:
                missing += missing_fields(getattr(value, name), raw[key], f"{where}.{key}")
        return missing
    if isinstance(value, list) and isinstance(raw, list):
        return [
            m
            for n, (v, r) in enumerate(zip(value, raw, strict=True))
            for m in missing_fields(v, r, f"{where}[{n}]")
        ]
    return []


def _is_json_of(value: object, kinds: tuple[type, ...]) -> bool:
    """Whether `value` is of one of `kinds`, a boolean counting as no number."""
    return isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool))


def checked_response(raw: dict[str, Any]) -> Response:
    """`raw` as the SDK's `Response`, after checking it has every required field."""
    response = Response.model_validate(raw, strict=True)
    missing = missing_fields(response, raw)
    for name, kinds in DOCUMENTED.items():
        if not _is_json_of(raw.get(name), kinds):
            missing.append(f".{name} ({' or '.join(k.__name__ for k in kinds)})")
    for n, tool in enumerate(raw["tools"]):
        if tool.get("type") == "function" and not isinstance(tool.get("strict"), bool):
            missing.append(f".tools[{n}].strict (bool)")
    assert not missing, f"the response object lacks {missing}: {raw}"
    return response


def check_compaction(raw: dict[str, Any]) -> None:
    """Whether `raw` is the SDK's `CompactedResponse` with every required field.

    Its `output` is typed as output items, which have no user or developer message, yet
    it holds the kept and preserved ones: each item is checked as the SDK's `ResponseItem`
    (what a listing of items holds) instead."""
    outside = {**raw, "output": []}
    missing = missing_fields(CompactedResponse.model_validate(outside, strict=True), outside)
    assert isinstance(raw.get("output"), list), raw
    for n, item in enumerate(raw["output"]):
        missing += missing_fields(ITEM.validate_python(item, strict=True), item, f".output[{n}]")
    assert not missing, f"the compacted response lacks {missing}: {raw}"
