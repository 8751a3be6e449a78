"""The API keys' rate limits at the edge: who may start a generation, what its answer
says about the limits, and how its tokens get charged.

A generating route (and each route that renders a whole input to count its tokens) is
wrapped in `rate_limited`: before it reads its body, the limiter
(`quotas.py`) admits the request or refuses it with a 429 whose `Retry-After` is
the end of the spent limit's window. Every answer of such a route, refusals and
successes alike, carries OpenAI's headers (`x-ratelimit-limit-requests`,
`-remaining-requests`, `-reset-requests`, and the same for `-tokens`) for the limits that
are on. The route hands its prepared generation to `metered`, which reserves its input
tokens and `max_output_tokens` on the key's token limits (a 429 when the key is already
past one), so the slot that ends it settles the reservation with what it spent.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Awaitable, Callable
from typing import ParamSpec

from quart import Response

from mlxcel.errors import LimitReached, QuotaExceeded, RequestRateLimited, TokenRateLimited
from mlxcel.generation import GenerateText, GenerationRequest
from mlxcel.http.guards import current_tenant, exchange_scope
from mlxcel.http.handles import handles
from mlxcel.items import ResponseRecord
from mlxcel.quotas import Admission, Meter

ADMISSION_KEY = "mlxcel.admission"
"""Where a request's scope keeps what the limiter decided for it."""

P = ParamSpec("P")


def rate_limited(view: Callable[P, Awaitable[Response]]) -> Callable[P, Awaitable[Response]]:
    """The view, run only once the request's key is admitted under its limits."""

    @functools.wraps(view)
    async def limited(*args: P.args, **kwargs: P.kwargs) -> Response:
        await admit()
        return await view(*args, **kwargs)

    return limited


async def admit() -> None:
    """Admit the current request under its key's limits (counting it), or raise the
    `LimitReached` that refuses it."""
    limiter = handles().limiter
    if limiter is None:
        return
    admission = await limiter.admit(current_tenant())
    _scope()[ADMISSION_KEY] = admission
    if admission.refused is not None:
        raise refusal(admission)


async def metered(generation: GenerationRequest) -> GenerationRequest:
    """`generation`, its tokens reserved on the current request's key (a `LimitReached`
    when the key is past a token limit) and settled once it ends."""
    admission = _admission()
    limiter = handles().limiter
    if admission is None or limiter is None:
        return generation
    reserved = len(generation.prompt) + generation.sampling.max_tokens
    spend, admission = await limiter.reserve(admission, reserved)
    if admission.refused is not None:
        raise refusal(admission)
    return generation if spend is None else dataclasses.replace(generation, spend=spend)


def metered_generate(generate: GenerateText) -> GenerateText:
    """`generate`, each generation it runs reserved on and charged to the current
    request's key."""
    if _admission() is None or handles().limiter is None:
        return generate

    async def charged(generation: GenerationRequest) -> ResponseRecord:
        return await generate(await metered(generation))

    return charged


async def add_rate_limit_headers(response: Response) -> Response:
    """OpenAI's rate-limit headers on the answer of a request the limiter saw."""
    admission = _admission()
    if admission is not None:
        for kind, meter in (("requests", admission.requests), ("tokens", admission.tokens)):
            if meter is not None:
                response.headers[f"x-ratelimit-limit-{kind}"] = str(meter.limit)
                response.headers[f"x-ratelimit-remaining-{kind}"] = str(meter.remaining)
                response.headers[f"x-ratelimit-reset-{kind}"] = duration(meter.resets_in)
    return response


def refusal(admission: Admission) -> LimitReached:
    """The 429 of a refused request."""
    who = f" for key {admission.tenant!r}" if admission.tenant else ""
    match admission.refused:
        case "daily":
            meter = _meter(admission.daily)
            return QuotaExceeded(
                f"You exceeded your daily token quota{who}: Limit {meter.limit}, Used "
                f"{meter.used}. It renews at midnight UTC, in {duration(meter.resets_in)}.",
                retry_after_secs=meter.retry_after_secs,
            )
        case "tokens":
            meter = _meter(admission.tokens)
            return TokenRateLimited(
                f"Rate limit reached{who} on tokens per min (TPM): Limit {meter.limit}, "
                f"Used {meter.used}. Please try again in {duration(meter.resets_in)}.",
                retry_after_secs=meter.retry_after_secs,
            )
        case _:
            meter = _meter(admission.requests)
            return RequestRateLimited(
                f"Rate limit reached{who} on requests per min (RPM): Limit {meter.limit}, "
                f"Used {meter.used}, Requested 1. Please try again in "
                f"{duration(meter.resets_in)}.",
                retry_after_secs=meter.retry_after_secs,
            )


def duration(secs: float) -> str:
    """A time span as OpenAI's headers write it: `20ms`, `1s`, `1.5s`, `6m0s`, `1h2m3s`."""
    ms = max(0, math.ceil(secs * 1000))
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{seconds}"
    if minutes:
        return f"{minutes}m{seconds}"
    return seconds


def _meter(meter: Meter | None) -> Meter:
    assert meter is not None  # the limit that refused is on
    return meter


def _scope() -> dict[str, object]:
    return exchange_scope()


def _admission() -> Admission | None:
    found = _scope().get(ADMISSION_KEY)
    return found if isinstance(found, Admission) else None
