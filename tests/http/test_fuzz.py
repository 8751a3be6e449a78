"""Every operation of the served OpenAPI document, fuzzed over real HTTP (fake engine).

Schemathesis generates requests from `/openapi.json`, valid and invalid ones; whatever
is sent, no answer is a 5xx, every JSON answer (and every event of a stream) is strict
JSON, without NaN or Infinity, and every 4xx is the OpenAI error object (Anthropic's on
its routes). So that valid
requests get past the first lookup, some name the served model and the ids of a stored
response and a conversation made just before. The run is bounded and derandomised: the
same requests on every run.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from mlxcel.model.fake import FakeEngine

from support import StartServer, in_thread

EXAMPLES = 25
"""Per operation and mode (valid data, invalid data)."""

MODEL = "fake-model"
FREE_FORM = ("tools", "tool_choice", "text", "reasoning", "include", "chat_template_kwargs")
"""Fields the document leaves open (the routes check them): random values are refused."""
ERROR_KEYS = {"message", "type", "param", "code"}


@dataclass
class Outcome:
    calls: int = 0
    operations: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict_json(data: bytes | str) -> Any:
    return json.loads(data, parse_constant=_reject_constant)


def problem_with(response: schemathesis.Response, anthropic: bool = False) -> str | None:
    """What is wrong with an answer, if anything (`anthropic`: on an Anthropic route)."""
    status = response.status_code
    if status >= 500:
        return f"server error {status}"
    headers = {name.lower(): values for name, values in response.headers.items()}
    content_type = (headers.get("content-type") or [""])[0]
    if content_type.startswith("text/event-stream"):
        return _stream_problem(response.content)
    if not content_type.startswith("application/json"):
        return None if status < 400 else f"an error that is not JSON ({content_type!r})"
    try:
        body = strict_json(response.content)
    except ValueError as exc:
        return f"invalid JSON ({exc})"
    if status < 400:
        return None
    if anthropic:
        return _anthropic_problem(body, headers)
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or set(error) != ERROR_KEYS:
        return "an error that is not the OpenAI error object"
    if not isinstance(error["message"], str) or not isinstance(error["type"], str):
        return "an error whose message or type is not a string"
    if not all(error[key] is None or isinstance(error[key], str) for key in ("param", "code")):
        return "an error whose param or code is neither a string nor null"
    return None


def _anthropic_problem(body: Any, headers: dict[str, list[str]]) -> str | None:
    if not isinstance(body, dict) or set(body) != {"type", "error", "request_id"}:
        return "an error that is not the Anthropic error object"
    error = body["error"]
    if not isinstance(error, dict) or set(error) != {"type", "message"}:
        return "an Anthropic error whose `error` is not a type and a message"
    if not all(isinstance(error[key], str) for key in error):
        return "an Anthropic error whose type or message is not a string"
    if body["request_id"] != (headers.get("request-id") or [None])[0]:
        return "an Anthropic error whose request_id is not its request-id header"
    return None


def _stream_problem(content: bytes) -> str | None:
    """Each complete event's data is strict JSON (or the chat streams' `[DONE]`)."""
    events = content.decode().split("\n\n")[:-1]  # the last may have been cut short
    for event in events:
        for line in event.splitlines():
            if line.startswith("data:") and line != "data: [DONE]":
                try:
                    strict_json(line.removeprefix("data:"))
                except ValueError as exc:
                    return f"an event that is not JSON ({exc}): {line[:200]}"
    return None


def seed(session: requests.Session, base_url: str) -> dict[str, str]:
    """A stored response and a conversation with an item: ids for valid requests."""
    body = {"model": MODEL, "input": "echo: seeded", "store": True}
    response = session.post(f"{base_url}/v1/responses", json=body, timeout=30)
    items = [{"role": "user", "content": "hello"}]
    conversation = session.post(f"{base_url}/v1/conversations", json={"items": items}, timeout=30)
    conversation_id = conversation.json()["id"]
    listed = session.get(f"{base_url}/v1/conversations/{conversation_id}/items", timeout=30)
    return {
        "response_id": response.json()["id"],
        "conversation_id": conversation_id,
        "item_id": listed.json()["data"][0]["id"],
        "model_id": MODEL,
    }


def fuzz(base_url: str) -> Outcome:
    """Fuzz each `/v1` operation (the same views are mounted without it) and `/health`."""
    # A config of its own (no project file applies); reports show the values sent, not
    # `[Filtered]` for fields named like secrets (`max_output_tokens`).
    config = schemathesis.Config.from_dict({"output": {"sanitization": {"enabled": False}}})
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json", config=config, timeout=30)
    outcome = Outcome()
    with requests.Session() as session:
        for result in schema.get_all_operations():
            operation = result.ok()
            if not operation.path.startswith("/v1/") and operation.path != "/health":
                continue
            outcome.operations.append(operation.label)
            known = seed(session, base_url)  # afresh: a previous operation may delete them
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                _fuzz_operation(operation, mode, known, base_url, session, outcome)
    return outcome


def _cases(operation: Any, mode: GenerationMode, known: dict[str, str]) -> Any:
    """Generated cases; valid ones often with real ids, or the served model's name and
    neither free-form fields nor compaction items, to get past the checks made after
    validation."""
    generated = operation.as_strategy(generation_mode=mode)
    if mode is GenerationMode.NEGATIVE:
        return generated
    names = [p.name for p in operation.path_parameters]
    if names:
        real = {name: known[name] for name in names}
        generated = st.one_of(operation.as_strategy(path_parameters=real), generated)

    def name_the_model(case: schemathesis.Case, served: bool) -> schemathesis.Case:
        if served and isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = MODEL
            for name in (*FREE_FORM, "conversation", "previous_response_id"):
                case.body.pop(name, None)
            if isinstance(case.body.get("input"), list):  # only the server makes these
                case.body["input"] = [i for i in case.body["input"] if not _compaction(i)]
        return case

    return st.builds(name_the_model, generated, st.sampled_from([True, True, False]))


def _compaction(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") == "compaction"


def _fuzz_operation(
    operation: Any,
    mode: GenerationMode,
    known: dict[str, str],
    base_url: str,
    session: requests.Session,
    outcome: Outcome,
) -> None:
    @given(case=_cases(operation, mode, known))
    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],  # problems are collected, not shrunk
        suppress_health_check=list(HealthCheck),
    )
    def run(case: schemathesis.Case) -> None:
        outcome.calls += 1
        try:
            response = case.call(base_url=base_url, session=session, timeout=10)
        except requests.RequestException as exc:
            answer = f"no answer: {exc!r}"
        else:
            anthropic = operation.path.startswith("/v1/messages")
            problem = problem_with(response, anthropic)
            if problem is None:
                return
            answer = f"{problem}: {response.status_code} {response.content[:500]!r}"
        request = case.as_curl_command(base_url=base_url)[:2000]
        outcome.problems.append(f"{operation.label} ({mode.value}): {answer}\n  {request}")

    try:
        run()
    except Unsatisfiable:
        if mode is GenerationMode.POSITIVE:
            raise  # an operation without parameters has no invalid requests


async def test_fuzzing_every_operation_finds_no_server_error(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(FakeEngine(), parallel=4)
    started = time.monotonic()
    outcome = await in_thread(fuzz, server.url)
    elapsed = time.monotonic() - started
    print(f"{outcome.calls} requests to {len(outcome.operations)} operations in {elapsed:.1f} s")
    assert len(outcome.operations) == 28, outcome.operations  # the model routes too
    assert not outcome.problems, "\n".join(outcome.problems)
