"""The sampling fields Chat Completions and Completions have and the Responses API has
not, `logit_bias` and `n`, and the penalties all three take, `frequency_penalty` and
`presence_penalty`, checked at the edge.

Penalties are OpenAI's range, -2 to 2 (each body's schema holds it). A `logit_bias` maps
token ids, written as JSON object keys, to values from -100 to 100, at most
`MAX_LOGIT_BIAS` of them (the count is checked before the map is validated, so a huge
map costs one `len`); ids past the model's vocabulary are refused once the model is
known (`prepare/intake.py`). `n` asks for that many choices, at most `MAX_CHOICES`.
`stop` and `seed` are read here too, as both wire formats share them.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from mlxcel.errors import InvalidRequest

MAX_LOGIT_BIAS = 1024
"""Entries a `logit_bias` may have: each is applied at every step of the sequence."""
LOGIT_BIAS_RANGE = 100.0
SEED_RANGE = 2**63
"""A seed is any signed 64-bit integer, as OpenAI takes it."""
MAX_CHOICES = 8
"""Choices one request may ask for (`n`): each takes a generation slot of its own."""

Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


def check_logit_bias_size(data: Any) -> None:
    """400 for a body whose `logit_bias` has more than `MAX_LOGIT_BIAS` entries (before
    anything validates them one by one)."""
    bias = data.get("logit_bias") if isinstance(data, dict) else None
    if isinstance(bias, dict) and len(bias) > MAX_LOGIT_BIAS:
        raise InvalidRequest(
            f"Invalid 'logit_bias': {len(bias)} entries; at most {MAX_LOGIT_BIAS} are accepted.",
            param="logit_bias",
            code="invalid_value",
        )


def logit_bias(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """The map as (token id, value) pairs, ids ascending; 400 for a key that is not a
    token id or a value out of range."""
    if not bias:
        return ()
    pairs: dict[int, float] = {}
    for key, value in bias.items():
        token = _token_id(key)
        if not -LOGIT_BIAS_RANGE <= value <= LOGIT_BIAS_RANGE:
            raise InvalidRequest(
                f"Invalid 'logit_bias': the value for token {token} is {value}; values run "
                f"from -{LOGIT_BIAS_RANGE:g} to {LOGIT_BIAS_RANGE:g}.",
                param="logit_bias",
                code="invalid_value",
            )
        pairs[token] = float(value)
    return tuple(sorted(pairs.items()))


def _token_id(key: str) -> int:
    text = key.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise InvalidRequest(
            f"Invalid 'logit_bias': {key[:32]!r} is not a token id (a non-negative integer).",
            param="logit_bias",
            code="invalid_value",
        )
    return int(text)


def check_n(n: int | None) -> int:
    """How many choices the request asks for (1 when `n` is not sent); 400 outside
    1..`MAX_CHOICES`."""
    if n is None:
        return 1
    if not 1 <= n <= MAX_CHOICES:
        raise InvalidRequest(
            f"Invalid 'n': {n}; this server generates from 1 to {MAX_CHOICES} choices per request.",
            param="n",
            code="invalid_value",
        )
    return n


def stops(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def wrapped_seed(seed: int | None) -> int | None:
    """The engine's generator takes an unsigned 64-bit seed."""
    return None if seed is None else seed % SEED_RANGE
