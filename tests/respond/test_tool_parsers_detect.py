"""Choosing the tool-call format from a chat template, and building its parser."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlxcel.respond.tool_parsers import (
    PARSERS,
    FunctionaryToolParser,
    HermesToolParser,
    Llama3JsonToolParser,
    MistralToolParser,
    PythonicToolParser,
    Qwen3CoderToolParser,
    TextPiece,
    detect_parser,
    make_parser,
)

QWEN3_CODER = (
    "If you choose to call a function ONLY reply in the following format:\n<tool_call>\n"
    "<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
    "</parameter>\n</function>\n</tool_call>"
)
HERMES = (
    "return a json object with function name and arguments within <tool_call></tool_call> "
    'XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
)
MISTRAL = "{%- if tools %}[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS]{%- endif %}[TOOL_CALLS]"
LLAMA31 = (
    "{{- '<|start_header_id|>ipython<|end_header_id|>' }}{{- '<|python_tag|>' }}{{- '<|eot_id|>' }}"
)
LLAMA32 = (
    "Given the following functions, please respond with a JSON for a function call with its "
    'proper arguments.\nRespond in the format {"name": function name, "parameters": '
    "dictionary of argument name and its value}.{{- '<|eot_id|>' }}"
)
PYTHONIC = (
    "If you decide to invoke any of the function(s), you MUST put it in the format of "
    "[func_name1(params_name1=params_value1, params_name2=params_value2...), "
    'func_name2(params)]\nHere is a list of functions in JSON format: {"parameters": {}}'
    "{{- '<|eot_id|>' }}"
)
FUNCTIONARY = (
    "If you choose to call a function ONLY reply in the following format:\n"
    '<function=example_function_name>{"example_name": "example_value"}</function>\n'
    "{{- '<|start_header_id|>ipython<|end_header_id|>' }}{{- '<|python_tag|>' }}<|eot_id|>"
)


def test_the_formats_offered() -> None:
    assert list(PARSERS) == [
        "hermes",
        "mistral",
        "llama3_json",
        "qwen3_coder",
        "functionary",
        "pythonic",
    ]


@pytest.mark.parametrize(
    ("kind", "cls"),
    [
        ("hermes", HermesToolParser),
        ("mistral", MistralToolParser),
        ("llama3_json", Llama3JsonToolParser),
        ("qwen3_coder", Qwen3CoderToolParser),
        ("functionary", FunctionaryToolParser),
        ("pythonic", PythonicToolParser),
    ],
)
def test_make_parser_builds_each_format(kind: str, cls: type) -> None:
    parser = make_parser(kind, frozenset({"f"}), {"f": {"type": "object"}})
    assert type(parser) is cls
    assert [*parser.feed("hi"), *parser.finish()] == [TextPiece("hi")]
    assert parser.text == "hi"


def test_make_parser_rejects_an_unknown_format() -> None:
    with pytest.raises(ValueError, match="unknown tool-call format 'harmony'"):
        make_parser("harmony", frozenset())


@pytest.mark.parametrize(
    ("template", "kind"),
    [
        (QWEN3_CODER, "qwen3_coder"),
        (HERMES, "hermes"),
        (MISTRAL, "mistral"),
        (LLAMA31, "llama3_json"),
        (LLAMA32, "llama3_json"),
        (PYTHONIC, "pythonic"),
        (FUNCTIONARY, "functionary"),
        ("{{ messages }}", "hermes"),
        ("", "hermes"),
        (None, "hermes"),
    ],
)
def test_detect_from_the_template(template: str | None, kind: str) -> None:
    assert detect_parser(template) == kind


@pytest.mark.parametrize(
    ("model_type", "kind"),
    [
        ("mistral", "mistral"),
        ("mixtral", "mistral"),
        ("llama", "llama3_json"),
        ("llama4", "pythonic"),
        ("qwen3_moe", "qwen3_coder"),
        ("qwen2", "hermes"),
        (None, "hermes"),
    ],
)
def test_model_type_is_a_hint_when_the_template_is_silent(
    model_type: str | None, kind: str
) -> None:
    assert detect_parser("{{ messages }}", model_type) == kind
    assert detect_parser(None, model_type) == kind


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen3_moe", "llama4"])
def test_the_template_wins_over_the_model_type(model_type: str) -> None:
    assert detect_parser(HERMES, model_type) == "hermes"
    assert detect_parser(QWEN3_CODER, model_type) == "qwen3_coder"


def test_the_default_model_template_is_hermes() -> None:
    from mlxcel.model.provision.fetch import default_model_dir, is_ready

    path = default_model_dir()
    if not is_ready(path):
        pytest.skip("the default model has not been fetched")
    config = json.loads((Path(path) / "tokenizer_config.json").read_text())
    model_type = json.loads((Path(path) / "config.json").read_text()).get("model_type")
    assert detect_parser(config["chat_template"], model_type) == "hermes"
