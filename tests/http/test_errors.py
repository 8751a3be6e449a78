"""The one map from exceptions to HTTP statuses and OpenAI error bodies."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import werkzeug.exceptions as wz
from pydantic import ValidationError

from mlxcel.errors import (
    BodyTimeout,
    ConfigError,
    ContextLengthExceeded,
    GenerationFailed,
    InvalidRequest,
    MlxcelError,
    ModelNotFound,
    ModelNotReady,
    NotFound,
    Overloaded,
    QueueFull,
    QuotaExceeded,
    RateLimited,
    RequestRateLimited,
    RequestTooLarge,
    ShuttingDown,
    Unauthenticated,
    UnsupportedFeature,
    UnsupportedMediaType,
)
from mlxcel.http.errors import anthropic_error, error_headers, map_error, validation_body
from mlxcel.http.schemas import CreateResponseBody

GENERIC = "The server had an error while processing your request."


def body(message: str, type_: str, param: str | None = None, code: str | None = None) -> Any:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


# --- mlxcel's own errors ----------------------------------------------------------

INVALID = "invalid_request_error"


@pytest.mark.parametrize(
    ("exc", "status", "type_"),
    [
        pytest.param(InvalidRequest("bad"), 400, INVALID, id="InvalidRequest"),
        pytest.param(UnsupportedFeature("no"), 400, INVALID, id="UnsupportedFeature"),
        # Subclasses of InvalidRequest with a status of their own, not its 400.
        pytest.param(RequestTooLarge("big"), 413, INVALID, id="RequestTooLarge"),
        pytest.param(BodyTimeout("slow"), 408, INVALID, id="BodyTimeout"),
        pytest.param(UnsupportedMediaType("xml"), 415, INVALID, id="UnsupportedMediaType"),
        pytest.param(NotFound("gone"), 404, INVALID, id="NotFound"),
        pytest.param(Unauthenticated("key"), 401, INVALID, id="Unauthenticated"),
        # Overloaded's subclasses differ: a full queue is the server's (503), the job cap
        # is the client's rate (429), and so is Overloaded itself.
        pytest.param(QueueFull("full"), 503, "server_error", id="QueueFull"),
        pytest.param(RateLimited("jobs"), 429, "rate_limit_error", id="RateLimited"),
        pytest.param(Overloaded("busy"), 429, "rate_limit_error", id="Overloaded"),
        pytest.param(ShuttingDown("bye"), 503, "server_error", id="ShuttingDown"),
        pytest.param(ModelNotReady("loading"), 503, "server_error", id="ModelNotReady"),
        pytest.param(GenerationFailed("engine"), 500, "server_error", id="GenerationFailed"),
        pytest.param(ConfigError("flags"), 500, "server_error", id="ConfigError"),
    ],
)
def test_each_error_has_its_status_and_type(exc: MlxcelError, status: int, type_: str) -> None:
    assert map_error(exc) == (status, body(exc.message, type_))


def test_param_and_code_travel_with_the_error() -> None:
    exc = InvalidRequest("Bad temperature.", param="temperature", code="invalid_value")
    assert map_error(exc) == (
        400,
        body("Bad temperature.", INVALID, param="temperature", code="invalid_value"),
    )


def test_errors_that_name_their_own_param_and_code() -> None:
    status, error = map_error(ContextLengthExceeded("The input is too long."))
    assert status == 400
    assert error == body(
        "The input is too long.", INVALID, param="input", code="context_length_exceeded"
    )
    status, error = map_error(ModelNotFound("gpt-9", ["fake-model"]))
    assert status == 404
    assert error["error"]["param"] == "model"
    assert error["error"]["code"] == "model_not_found"
    assert "'gpt-9'" in error["error"]["message"]
    assert "'fake-model'" in error["error"]["message"]


def _subclasses(cls: type[MlxcelError]) -> list[type[MlxcelError]]:
    return [s for c in cls.__subclasses__() for s in (c, *_subclasses(c))]


def test_every_error_class_has_a_row(caplog: pytest.LogCaptureFixture) -> None:
    """An error class added without a row would leave as an anonymous 500."""
    classes = _subclasses(MlxcelError)
    assert len(classes) >= 16
    for cls in classes:
        exc = ModelNotFound("m", []) if cls is ModelNotFound else cls("a message")
        status, error = map_error(exc)
        assert error["error"]["message"] == exc.message, cls
        assert status != 500 or cls in (GenerationFailed, ConfigError), cls
    assert not caplog.records  # none of them is logged as unhandled


# --- HTTP errors raised by the framework -----------------------------------------


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (wz.NotFound(), 404, "not_found"),
        (wz.MethodNotAllowed(["GET"]), 405, "method_not_allowed"),
        (wz.RequestTimeout(), 408, "request_timeout"),
        (wz.RequestEntityTooLarge(), 413, "request_too_large"),
        (wz.UnsupportedMediaType(), 415, "unsupported_media_type"),
        (wz.BadRequest(), 400, None),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, wz.HTTPException) else None,
)
def test_http_exceptions_keep_their_status_and_get_a_code(
    exc: wz.HTTPException, status: int, code: str | None
) -> None:
    assert exc.description
    assert map_error(exc) == (status, body(exc.description, INVALID, code=code))


def test_an_http_server_error_is_a_server_error() -> None:
    exc = wz.ServiceUnavailable("try later")
    assert map_error(exc) == (503, body("try later", "server_error"))


def test_an_http_exception_without_a_description_is_described_by_its_name() -> None:
    exc = wz.NotFound(description="")
    assert map_error(exc) == (404, body("Not Found", INVALID, code="not_found"))


# --- anything else ----------------------------------------------------------------


def test_an_unhandled_exception_is_a_generic_500_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    try:
        raise KeyError("secret-key at /srv/models/private")
    except KeyError as exc:
        raised = exc
        status, error = map_error(exc)
    assert (status, error) == (500, body(GENERIC, "server_error"))
    text = json.dumps(error)
    for leak in ("secret", "/srv", "KeyError", "Traceback", "line "):
        assert leak not in text
    # The details go to the log instead, traceback included.
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None
    assert record.exc_info[1] is raised


# --- validation errors ----------------------------------------------------------------


def invalid(payload: dict[str, Any]) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        CreateResponseBody.model_validate(payload)
    return caught.value


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        # The error locations run through union branches (`str`, `list[...]`) and item
        # tags (`message`, `input_text`): none of them is a field the client sent.
        ({"model": "m", "input": [{"role": "user", "content": 5}]}, "input[0].content"),
        (
            {
                "model": "m",
                "input": [{"role": "user", "content": [{"type": "output_text", "text": 1}]}],
            },
            "input[0].content[0].text",
        ),
        (
            {
                "model": "m",
                "input": [
                    {"role": "user", "content": "hi"},
                    {
                        "type": "function_call_output",
                        "call_id": "c",
                        "output": [{"type": "input_text", "text": 1}],
                    },
                ],
            },
            "input[1].output[0].text",
        ),
        ({"model": "m", "input": "hi", "metadata": {"k": 1}}, "metadata.k"),
        ({"model": "m", "input": "hi", "temperature": 3}, "temperature"),
        ({"model": "m", "input": "hi", "stream": "yes"}, "stream"),
    ],
)
def test_param_names_the_field_as_the_client_wrote_it(payload: dict[str, Any], param: str) -> None:
    exc = invalid(payload)
    error = validation_body(exc)["error"]
    assert error["param"] == param
    assert error["message"].startswith(f"Invalid value for '{param}': ")
    assert error["message"].endswith(".")
    assert (error["type"], error["code"]) == (INVALID, "invalid_value")
    assert map_error(exc) == (400, {"error": error})


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"input": "hi"}, "model"),
        ({"model": "m", "input": [{"type": "message", "role": "user"}]}, "input[0].content"),
        (
            {"model": "m", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "input[0].call_id",
        ),
    ],
)
def test_a_missing_field_is_named_as_missing(payload: dict[str, Any], param: str) -> None:
    error = validation_body(invalid(payload))["error"]
    assert error == {
        "message": f"Missing required parameter: '{param}'.",
        "type": INVALID,
        "param": param,
        "code": "invalid_value",
    }


def test_of_a_unions_errors_the_deepest_is_reported() -> None:
    # `input` fails as a string (depth 1) and inside the list (depth 4): the list's error
    # says what is actually wrong.
    exc = invalid(
        {"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": 1}]}]}
    )
    assert len(exc.errors()) > 1
    error = validation_body(exc)["error"]
    assert error["param"] == "input[0].content[0].text"
    assert "valid string" in error["message"]


def test_a_spent_key_limit_says_when_its_window_ends() -> None:
    spent = QuotaExceeded("spent", retry_after_secs=3600)
    assert map_error(spent) == (
        429,
        body("spent", "insufficient_quota", code="insufficient_user_quota"),
    )
    assert error_headers(spent, 429) == {"Retry-After": "3600"}
    limited = RequestRateLimited("slow down", retry_after_secs=17)
    assert map_error(limited) == (429, body("slow down", "requests", code="rate_limit_exceeded"))
    assert error_headers(limited, 429) == {"Retry-After": "17"}
    # Every other 429 or 503 is worth a retry in a second; nothing else says when.
    assert error_headers(QueueFull("full"), 503) == {"Retry-After": "1"}
    assert error_headers(RateLimited("jobs"), 429) == {"Retry-After": "1"}
    assert error_headers(InvalidRequest("bad"), 400) == {}


# --- Anthropic's rendering (the Messages API's routes) --------------------------------


@pytest.mark.parametrize(
    ("exc", "status", "type_"),
    [
        pytest.param(InvalidRequest("bad"), 400, INVALID, id="InvalidRequest"),
        pytest.param(Unauthenticated("key"), 401, "authentication_error", id="Unauthenticated"),
        pytest.param(ModelNotFound("claude-x", ["m"]), 404, "not_found_error", id="ModelNotFound"),
        pytest.param(RequestTooLarge("big"), 413, "request_too_large", id="RequestTooLarge"),
        pytest.param(RequestRateLimited("rpm"), 429, "rate_limit_error", id="RequestRateLimited"),
        pytest.param(QuotaExceeded("daily"), 429, "rate_limit_error", id="QuotaExceeded"),
        pytest.param(GenerationFailed("engine"), 500, "api_error", id="GenerationFailed"),
        pytest.param(ShuttingDown("bye"), 503, "api_error", id="ShuttingDown"),
        pytest.param(QueueFull("full"), 529, "overloaded_error", id="QueueFull"),
        pytest.param(wz.Forbidden(), 403, "permission_error", id="Forbidden"),
        pytest.param(RuntimeError("bug"), 500, "api_error", id="unhandled"),
    ],
)
def test_anthropic_errors_have_anthropics_statuses_and_types(
    exc: BaseException, status: int, type_: str
) -> None:
    got_status, got = anthropic_error(exc)
    assert got_status == status
    assert got == {"type": "error", "error": {"type": type_, "message": got["error"]["message"]}}
    assert got["error"]["message"]
    assert ("Retry-After" in error_headers(exc, got_status)) is (status in (429, 503, 529))


def test_a_context_overflow_is_worded_as_anthropic_words_it() -> None:
    exc = ContextLengthExceeded("too long", tokens=40_123, maximum=32_768)
    assert anthropic_error(exc) == (
        400,
        {
            "type": "error",
            "error": {
                "type": INVALID,
                "message": "prompt is too long: 40123 tokens > 32768 maximum",
            },
        },
    )
    # Without counts (a compaction's overflow), its own words.
    assert anthropic_error(ContextLengthExceeded("too long"))[1]["error"]["message"] == "too long"
