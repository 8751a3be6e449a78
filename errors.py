"""The exception tree of mlxcel. No HTTP knowledge lives here: `mlxcel.http.errors`
is the one place that maps these to status codes and OpenAI error bodies.

    MlxcelError
    ├── InvalidRequest            the request itself is wrong (bad field, bad value)
    │   ├── ContextLengthExceeded the rendered prompt does not fit the context window
    │   ├── RequestTooLarge       the body is over the size limit
    │   ├── BodyTimeout           the body did not arrive within its deadline
    │   ├── UnsupportedMediaType  the body is not JSON
    │   └── UnsupportedFeature    a valid OpenAI feature this server does not offer
    ├── NotFound                  an id or route names nothing
    │   └── ModelNotFound         `model` names no loaded model
    ├── Overloaded                no room now; retrying later may work
    │   ├── QueueFull             the generation queue is full
    │   └── RateLimited           the background job cap (or its byte budget) is reached
    ├── LimitReached              the API key spent a limit; retry after `retry_after_secs`
    │   ├── RequestRateLimited    its requests per minute
    │   ├── TokenRateLimited      its tokens per minute
    │   └── QuotaExceeded         its tokens of the UTC day
    ├── Unauthenticated           no valid API key
    ├── PermissionDenied          a valid API key that may not do this (model management)
    ├── ShuttingDown              the server is draining; no new generation starts
    ├── ModelNotReady             the model is still loading
    ├── ModelLoadFailed           the model named could not be loaded
    ├── ModelPinned               a pinned model cannot be unloaded
    ├── GenerationFailed          the engine failed while generating
    └── ConfigError               flags or environment are invalid at start-up
"""

from __future__ import annotations


class MlxcelError(Exception):
    """Base of every error mlxcel raises on purpose."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class InvalidRequest(MlxcelError):
    """The request is malformed or asks for something impossible."""


class ContextLengthExceeded(InvalidRequest):
    """The rendered input (plus room for output) is longer than the context window."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = "input",
        tokens: int | None = None,
        maximum: int | None = None,
    ):
        super().__init__(message, param=param, code="context_length_exceeded")
        self.tokens = tokens
        """The prompt's tokens (or a lower bound on them, when it was not rendered)."""
        self.maximum = maximum
        """The context window it did not fit."""


class RequestTooLarge(InvalidRequest):
    """The request body is larger than the server accepts."""


class BodyTimeout(InvalidRequest):
    """The request body did not arrive whole within the body deadline."""


class UnsupportedMediaType(InvalidRequest):
    """The request body is not declared as JSON."""


class UnsupportedFeature(InvalidRequest):
    """A feature of the OpenAI API that this server does not provide."""


class NotFound(MlxcelError):
    """The named object does not exist (or has expired)."""


class ModelNotFound(NotFound):
    """The request names a model that is not loaded."""

    def __init__(self, model: str, available: list[str]):
        names = ", ".join(repr(a) for a in available)
        super().__init__(
            f"The model {model!r} does not exist or is not loaded here; available: {names}.",
            param="model",
            code="model_not_found",
        )


class Overloaded(MlxcelError):
    """The server has no room for the request right now."""


class QueueFull(Overloaded):
    """Every generation slot is busy and the waiting queue is full."""


class RateLimited(Overloaded):
    """Too many background jobs are active; retry after one ends."""


class LimitReached(MlxcelError):
    """The request's API key has spent one of its limits until its window ends."""

    CODE = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after_secs: int = 1):
        super().__init__(message, code=self.CODE)
        self.retry_after_secs = retry_after_secs


class RequestRateLimited(LimitReached):
    """The key sent as many requests this minute as it may."""


class TokenRateLimited(LimitReached):
    """The key spent as many tokens this minute as it may."""


class QuotaExceeded(LimitReached):
    """The key spent its tokens of the UTC day."""

    CODE = "insufficient_user_quota"


class Unauthenticated(MlxcelError):
    """The request carries no API key this server accepts."""


class PermissionDenied(MlxcelError):
    """The request's API key is valid but may not do what it asks: loading and unloading
    models takes an admin key."""


class ShuttingDown(MlxcelError):
    """The server is draining for shutdown and starts no new generation."""


class ModelNotReady(MlxcelError):
    """The model is still loading; the server answers once it is ready."""


class ModelLoadFailed(MlxcelError):
    """The model the request names could not be loaded (its folder is damaged, memory
    ran out); the other models serve on."""


class ModelPinned(MlxcelError):
    """The model is pinned (`--pin`): it stays loaded."""


class StoreUnavailable(MlxcelError):
    """The store could not be read or written (its disk is full, its file was damaged or
    removed); what was stored before is as it was."""


class GenerationFailed(MlxcelError):
    """The engine raised while generating this sequence."""


class ConfigError(MlxcelError):
    """Invalid command-line flags or environment variables."""
