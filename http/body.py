"""Reading JSON request bodies within a size limit.

An oversized body is read to its end and discarded before the 413 goes out: a client
still sending would otherwise never read the answer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable
from typing import Any

from mlxcel.errors import InvalidRequest, RequestTooLarge

MAX_BODY_BYTES = 64 * 1024 * 1024


async def read_json(body: AsyncIterable[bytes], limit: int = MAX_BODY_BYTES) -> Any:
    data = bytearray()
    size = 0
    async for chunk in body:
        size += len(chunk)
        if size <= limit:
            data.extend(chunk)
    if size > limit:
        raise RequestTooLarge(
            f"The request body is {size} bytes; the limit is {limit} bytes.",
            code="request_too_large",
        )
    return parse_json(bytes(data))


def parse_json(data: str | bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(
            "We could not parse the JSON body of your request. The body must be a JSON object.",
            code="invalid_json",
        ) from exc
