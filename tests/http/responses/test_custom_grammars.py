"""A `custom` tool's grammar that cannot be enforced on the model's call is a 400 naming
its definition, over real HTTP: never a request that runs with the call's input left
free. (The fake codec checks grammars as the real one does for a model that writes the
Hermes form, short of compiling them against a tokenizer.)"""

from __future__ import annotations

from typing import Any

import pytest

from support import FakeServer, an_ordinary_request_completes, post


def custom(syntax: str, definition: str, name: str = "hexdump") -> dict[str, Any]:
    return {
        "type": "custom",
        "name": name,
        "description": "Write the digest.",
        "format": {"type": "grammar", "syntax": syntax, "definition": definition},
    }


UNENFORCEABLE = [
    pytest.param("regex", "[0-9a-f]{4000}", "1000", id="regex-repetition"),
    pytest.param("lark", "start: /[0-9a-f]{4000}/", "1000", id="lark-repetition"),
    pytest.param("lark", "start: HEX\nHEX: /[0-9a-f]{2,1001}/", "1000", id="lark-terminal-range"),
    pytest.param("regex", "(?i)[a-f]+", "inline flags", id="regex-case-insensitive"),
    pytest.param("lark", 'start: "abc"i', "case-insensitive", id="lark-case-insensitive"),
    pytest.param("lark", 'start: "a"+\n%ignore " "', "%ignore", id="lark-ignore"),
]


@pytest.mark.parametrize(("syntax", "definition", "said"), UNENFORCEABLE)
@pytest.mark.parametrize("choice", ["auto", {"type": "custom", "name": "hexdump"}])
async def test_a_grammar_that_cannot_be_enforced_is_a_400_naming_its_definition(
    fake_server: FakeServer, syntax: str, definition: str, said: str, choice: Any
) -> None:
    body = {
        "model": "fake-model",
        "input": "Write the digest.",
        "tools": [custom(syntax, definition)],
        "tool_choice": choice,
    }
    r = await post(fake_server, "/v1/responses", body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "tools[0].format.definition"
    assert error["code"] == "invalid_grammar"
    assert "hexdump" in error["message"]
    assert said in error["message"]
    await an_ordinary_request_completes(fake_server)


async def test_a_namespaced_tool_and_a_later_tool_are_named_by_their_place(
    fake_server: FakeServer,
) -> None:
    fine = custom("regex", "[a-f]+", "fine")
    edit = {"type": "namespace", "name": "edit", "tools": [fine, custom("regex", "x{1001}")]}
    for tools, param in [
        ([fine, custom("regex", "x{1001}")], "tools[1].format.definition"),
        ([edit], "tools[0].tools[1].format.definition"),
    ]:
        body = {"model": "fake-model", "input": "Go.", "tools": tools}
        r = await post(fake_server, "/v1/responses", body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param
    await an_ordinary_request_completes(fake_server)


@pytest.mark.parametrize(
    ("syntax", "definition"),
    [("regex", "[0-9a-f]{1000}"), ("lark", 'start: term_a A\nterm_a: "x"\nA: "y"')],
)
async def test_grammars_within_the_limits_are_accepted(
    fake_server: FakeServer, syntax: str, definition: str
) -> None:
    body = {
        "model": "fake-model",
        "input": "echo: ok",
        "tools": [custom(syntax, definition)],
    }
    r = await post(fake_server, "/v1/responses", body)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "completed"
