"""Request bodies: received within a size limit and a deadline, parsed as strict JSON and
validated off the event loop.

Quart enforces the limits while the body arrives (`MAX_CONTENT_LENGTH`, `BODY_TIMEOUT`):
a `Content-Length` over the limit is refused before a byte is read, and a chunked body
stops being read at the limit; either way the connection closes after the 413.

The PDFs a body holds (`input_file` parts) are read after validation, each by a worker
process (`http/pdf_reading.py`): never in the validation thread, which every request needs.

Strict JSON is what every client parses: `NaN`, `Infinity` and numbers that overflow to
them are refused, as are strings with lone surrogates (no UTF-8 encoder can send them on)
and nesting deeper than any request needs (it would only feed recursion further in).
"""

from __future__ import annotations

import json
import math
from typing import Any, TypeVar

from pydantic import BaseModel
from quart import request
from werkzeug.exceptions import RequestEntityTooLarge, RequestTimeout

from mlxcel.errors import BodyTimeout, InvalidRequest, RequestTooLarge
from mlxcel.http.files import FilePart, collecting_pdfs
from mlxcel.http.pdf_reading import read_pdfs
from mlxcel.prepare.offload import off_loop

MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_JSON_DEPTH = 64
"""Objects and arrays nested deeper than this are refused; tool and output schemas, the
deepest parts of any request, stay far below it."""

M = TypeVar("M", bound=BaseModel)


async def read_model(model: type[M], *, empty: dict[str, Any] | None = None) -> M:
    """The request body as `model`; an empty body is `empty` when given (else a 400)."""
    data = await receive_body()
    validated: tuple[M, list[FilePart]] = await off_loop(_validated, model, data, empty)
    body, pdfs = validated
    if pdfs:
        await read_pdfs(body, pdfs)
    return body


async def model_from(model: type[M], raw: Any) -> M:
    """`raw`, a value already parsed from strict JSON (a WebSocket message's), validated
    as `model` as a request body is: off the event loop, its PDFs read after."""
    validated: tuple[M, list[FilePart]] = await off_loop(_checked, model, raw)
    body, pdfs = validated
    if pdfs:
        await read_pdfs(body, pdfs)
    return body


async def receive_body() -> bytes:
    """The whole body, or a 413 (over the limit) or 408 (over the deadline)."""
    try:
        return await request.get_data(cache=False, as_text=False, parse_form_data=False)
    except RequestEntityTooLarge:
        raise RequestTooLarge(
            f"The request body is larger than the {MAX_BODY_BYTES}-byte limit.",
            code="request_too_large",
        ) from None
    except RequestTimeout:
        raise BodyTimeout(
            "The request body did not arrive in time.", code="request_timeout"
        ) from None


def _validated(
    model: type[M], data: bytes, empty: dict[str, Any] | None
) -> tuple[M, list[FilePart]]:
    """The body as `model`, and its file parts holding a PDF still to read."""
    raw = empty if empty is not None and not data.strip() else parse_json(data)
    return _checked(model, raw)


def _checked(model: type[M], raw: Any) -> tuple[M, list[FilePart]]:
    with collecting_pdfs() as pdfs:
        return model.model_validate(raw), pdfs


def parse_json(data: str | bytes) -> Any:
    """`data` as strict JSON, or a 400 that says what is wrong with it."""
    try:
        value = json.loads(data, parse_constant=_refuse_constant, parse_float=_finite_float)
    except _NotFinite as exc:
        raise InvalidRequest(
            f"The JSON body contains {exc.args[0][:40]}, which JSON does not allow; "
            "send finite numbers only.",
            code="invalid_json",
        ) from None
    except RecursionError:
        raise _too_deep() from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(
            "We could not parse the JSON body of your request. The body must be a JSON object.",
            code="invalid_json",
        ) from exc
    if not _check_tree(value):
        raise _too_deep()
    return value


def _too_deep() -> InvalidRequest:
    return InvalidRequest(
        f"The JSON body is nested more than {MAX_JSON_DEPTH} levels deep.", code="invalid_json"
    )


class _NotFinite(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NotFinite(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


def _check_tree(value: Any) -> bool:
    """False when `value` nests too deep; a 400 for a string with a lone surrogate.

    Iterative, so no input can exhaust the stack."""
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        node, depth = pending.pop()
        if isinstance(node, str):
            _check_text(node)
        elif isinstance(node, dict | list):
            if depth >= MAX_JSON_DEPTH:
                return False
            if isinstance(node, dict):
                for key, child in node.items():
                    _check_text(key)
                    pending.append((child, depth + 1))
            else:
                pending.extend((child, depth + 1) for child in node)
    return True


def _check_text(text: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(
            "The JSON body contains a string with a lone surrogate (an unpaired "
            "\\ud800-\\udfff escape), which is not valid Unicode.",
            code="invalid_json",
        ) from None
