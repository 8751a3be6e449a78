"""Custom tools' grammars carried into the JSON string of the model's call: the reply's
grammar accepts a call exactly when the tool's grammar accepts its input.

Expected answers come from elsewhere: Python's `re` for regexes, and llguidance reading
the tool's own grammar over the raw input for Lark grammars.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import llguidance
import pytest
from patch_grammar import PATCH_GRAMMAR

from mlxcel.errors import InvalidRequest
from mlxcel.generation import CustomGrammar
from mlxcel.model.grammar.constrained import GrammarCompiler
from mlxcel.model.grammar.json_quote import Unquotable, quote_lark

from tiny_model import ensure_tiny_model

PATCHES = [
    '*** Begin Patch\n*** Add File: a "q".py\n+print("hi\\n")\t\n*** End Patch\n',
    "*** Begin Patch\n*** Update File: src/x.py\n@@ def f():\n-    return 1\n+    return 2\n"
    "*** End Patch",
    "*** Begin Patch\n*** Delete File: gone.txt\n*** End Patch\n",
    "*** Begin Patch\n*** Add File: é\\ü.txt\n+\x1b[0m\n*** End Patch\n",
    "*** Begin Patch\n*** Add File: a.txt\n*** End Patch\n",  # an Add File with no line
    "*** Begin Patch\n*** Update File: a\n+x\n*** End Patch\n*** End Patch\n",
    "*** Begin Patch\n*** Add File: a\n+x\n",
    "*** Begin Patch\n*** Add File: a\nx\n*** End Patch\n",
    "",
]


@pytest.fixture(scope="module")
def compiler() -> tuple[GrammarCompiler, Any]:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))
    return GrammarCompiler.for_hf_tokenizer(hf), hf


def _accepts(compiler: tuple[GrammarCompiler, Any], grammar: str, text: str) -> bool:
    grammars, hf = compiler
    matcher = grammars.matcher(grammar)
    tokens = hf.encode(text, add_special_tokens=False)
    return all(matcher.consume_token(t) for t in tokens) and matcher.is_accepting()


def _call(name: str, value: str) -> str:
    arguments = json.dumps({"name": name, "arguments": {"input": value}}, ensure_ascii=False)
    return f"<tool_call>\n{arguments}\n</tool_call>"


def _tokens(hf: Any) -> tuple[int, int]:
    return hf.convert_tokens_to_ids("<tool_call>"), hf.convert_tokens_to_ids("</tool_call>")


def _reply_grammar(compiler: tuple[GrammarCompiler, Any], tool: CustomGrammar) -> str:
    grammars, hf = compiler
    grammar = grammars.compile_custom_tools([tool], ["get_weather"], _tokens(hf))
    assert grammar is not None
    return grammar


def _raw_accepts(compiler: tuple[GrammarCompiler, Any], definition: str, text: str) -> bool:
    """The tool's own grammar over the raw input (llguidance, no rewriting)."""
    grammars, hf = compiler
    matcher = grammars.matcher(llguidance.LLMatcher.grammar_from_lark(definition))
    tokens = hf.encode(text, add_special_tokens=False)
    return all(matcher.consume_token(t) for t in tokens) and matcher.is_accepting()


def test_the_patch_grammar_holds_the_escaped_input_as_the_raw_one(
    compiler: tuple[GrammarCompiler, Any],
) -> None:
    grammar = _reply_grammar(compiler, CustomGrammar("apply_patch", "lark", PATCH_GRAMMAR, "t"))
    verdicts = []
    for patch in PATCHES:
        expected = _raw_accepts(compiler, PATCH_GRAMMAR, patch)
        assert _accepts(compiler, grammar, "Patching. " + _call("apply_patch", patch)) == expected
        verdicts.append(expected)
    assert True in verdicts
    assert False in verdicts


REGEXES = [
    (r"[A-Z]+", ["HI", "hi", "", 'A"B', "ABC"]),
    (r"(?:\d{3}-)?[a-z]+", ["123-abc", "abc", "12-abc", "123-"]),
    (r'say "[^"]*"', ['say "x y"', 'say "a"b"', 'say ""']),
    (r"(?s:.*)END", ["a\nb\\END", "END", "ENDx"]),
    (r"line\n(.+)\n?", ["line\nx", "line\nx\n", "line\n\n", "line\nx\ny"]),
    (r"[^a\n]+\\[\t ]", ["b\\\t", "a\\ ", "zz\\ "]),
    (r"\w+\s\S", ["ab\tc", "ab c", "ab\nc", "ab  "]),
]


@pytest.mark.parametrize(("pattern", "samples"), REGEXES)
def test_a_lark_regex_terminal_holds_what_python_matches(
    compiler: tuple[GrammarCompiler, Any], pattern: str, samples: list[str]
) -> None:
    definition = f"start: /{pattern}/"
    grammar = _reply_grammar(compiler, CustomGrammar("tool", "lark", definition, "t"))
    for sample in samples:
        expected = re.fullmatch(pattern, sample) is not None
        assert _accepts(compiler, grammar, _call("tool", sample)) == expected, sample


@pytest.mark.parametrize(("pattern", "samples"), REGEXES)
def test_a_regex_format_holds_what_python_matches(
    compiler: tuple[GrammarCompiler, Any], pattern: str, samples: list[str]
) -> None:
    grammar = _reply_grammar(compiler, CustomGrammar("tool", "regex", pattern, "t"))
    for sample in samples:
        expected = re.fullmatch(pattern, sample) is not None
        assert _accepts(compiler, grammar, _call("tool", sample)) == expected, sample


def test_text_and_other_calls_stay_free_and_unknown_tools_are_refused(
    compiler: tuple[GrammarCompiler, Any],
) -> None:
    grammar = _reply_grammar(compiler, CustomGrammar("shout", "regex", "[A-Z]+", "t"))
    weather = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "x"}}\n</tool_call>'
    assert _accepts(compiler, grammar, 'Any text at all, {"name": 1} too.')
    assert _accepts(compiler, grammar, "Weather: " + weather + " then more")
    assert _accepts(compiler, grammar, _call("shout", "HEY") + _call("shout", "YO"))
    assert not _accepts(compiler, grammar, _call("nobody", "HEY"))
    assert not _accepts(compiler, grammar, _call("shout", "hey"))


@pytest.mark.parametrize(
    "definition",
    [
        'start: "a"i',
        "start: /a/i",
        "start: /^a$/",
        "start: /(?=a)a/",
        "start: A\n%ignore /x/\nA: /a/",
        "start: /\\p{L}+/",
        "start: NUMBER\n%import common.NUMBER",
        "start: /a{2000}/",
    ],
)
def test_what_the_rewrite_cannot_carry_is_named(definition: str) -> None:
    with pytest.raises(Unquotable):
        quote_lark(definition)


@pytest.mark.parametrize(
    ("syntax", "definition", "said"),
    [
        ("lark", 'start: "a"i', "case-insensitive"),
        ("regex", "[0-9a-f]{4000}", "repetitions above 1000"),
        ("lark", "start: /[0-9a-f]{4000}/", "repetitions above 1000"),
        ("regex", "(?i)[a-f]+", "inline flags"),
    ],
)
def test_a_grammar_the_rewrite_cannot_carry_is_a_400_naming_the_tool(
    compiler: tuple[GrammarCompiler, Any], syntax: str, definition: str, said: str
) -> None:
    grammars, hf = compiler
    tool = CustomGrammar("hexdump", syntax, definition, "tools[1].format")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest) as caught:
        grammars.compile_custom_tools([tool], ["get_weather"], _tokens(hf))
    assert caught.value.param == "tools[1].format.definition"
    assert caught.value.code == "invalid_grammar"
    assert "hexdump" in caught.value.message
    assert said in caught.value.message


DEEP_LARK = "start: r0\n" + "\n".join(f'r{i}: r{i + 1} r{i + 1} | "x"' for i in range(500))


@pytest.mark.parametrize(
    ("syntax", "definition"),
    [
        ("regex", "((a{100}){100}){10}"),
        ("regex", "(x{1000}){1000}"),
        ("lark", 'start: "a" ~ 100000'),
        ("lark", DEEP_LARK + '\nr500: "y"'),
    ],
)
def test_a_grammar_whose_parse_outgrows_the_limits_at_once_is_a_400_naming_the_tool(
    compiler: tuple[GrammarCompiler, Any], syntax: str, definition: str
) -> None:
    """Each repetition is within the limit, or a Lark `~`; yet the run they force, or the
    ambiguity of 500 nested rules, is more than llguidance's parser holds per step from
    the input's first characters on, where a matcher in error would leave the call free."""
    grammars, hf = compiler
    tool = CustomGrammar("t", syntax, definition, "tools[0].format")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest) as caught:
        grammars.compile_custom_tools([tool], [], _tokens(hf), required=True)
    assert caught.value.param == "tools[0].format.definition"


def test_repetitions_up_to_the_limit_are_enforced_exactly(
    compiler: tuple[GrammarCompiler, Any],
) -> None:
    digits = "0123456789abcdef" * 63
    for tool, size in [
        (CustomGrammar("t", "regex", "[0-9a-f]{1000}", "t"), 1000),
        (CustomGrammar("t", "lark", "start: H ~ 4000\nH: /[0-9a-f]/", "t"), 4000),
    ]:
        grammar = _reply_grammar(compiler, tool)
        text = (digits * 4)[:size]
        assert _accepts(compiler, grammar, _call("t", text))
        assert not _accepts(compiler, grammar, _call("t", text[:-1]))
        assert not _accepts(compiler, grammar, _call("t", text + "a"))


def test_a_leading_dotall_flag_lets_the_dot_match_a_newline(
    compiler: tuple[GrammarCompiler, Any],
) -> None:
    grammar = _reply_grammar(compiler, CustomGrammar("t", "regex", "(?s)a.b", "t"))
    assert _accepts(compiler, grammar, _call("t", "a\nb"))
    assert not _accepts(compiler, grammar, _call("t", "a\n\nb"))


def test_a_rule_named_like_a_rewritten_terminal_is_kept_apart(
    compiler: tuple[GrammarCompiler, Any],
) -> None:
    definition = 'start: term_a A\nterm_a: "x"\nA: "y"'
    grammar = _reply_grammar(compiler, CustomGrammar("t", "lark", definition, "t"))
    assert _accepts(compiler, grammar, _call("t", "xy"))
    assert not _accepts(compiler, grammar, _call("t", "xx"))
    assert not _accepts(compiler, grammar, _call("t", "yy"))


def test_parameters_no_grammar_can_hold_beside_a_custom_tool_are_a_400(
    compiler: tuple[GrammarCompiler, Any],
) -> None:
    from mlxcel.model.prompt import TemplateCodec
    from mlxcel.prepare.tools import tool_use

    grammars, hf = compiler
    lookahead = {"type": "string", "pattern": "(?=x)a"}
    tools: list[dict[str, Any]] = [
        {
            "type": "function",
            "name": "f",
            "parameters": {"type": "object", "properties": {"a": lookahead}},
        },
        {
            "type": "custom",
            "name": "shout",
            "format": {"type": "grammar", "syntax": "regex", "definition": "[A-Z]+"},
        },
    ]
    with pytest.raises(InvalidRequest) as caught:
        tool_use(tools, "required", TemplateCodec(hf, grammars), parser="hermes")  # type: ignore[arg-type]
    assert caught.value.param == "tools"
    assert caught.value.code == "invalid_tool_parameters"


@pytest.mark.parametrize(
    ("syntax", "definition"),
    [
        ("lark", "start: missing"),
        ("lark", "start: ("),
        ("regex", "([a-z]"),
        ("lark", "start: /" + "a" * 70_000 + "/"),
    ],
)
def test_an_invalid_grammar_is_a_400_naming_the_tool(
    compiler: tuple[GrammarCompiler, Any], syntax: str, definition: str
) -> None:
    grammars, hf = compiler
    tool = CustomGrammar("apply_patch", syntax, definition, "tools[2].format")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest) as caught:
        grammars.compile_custom_tools([tool], [], _tokens(hf))
    assert caught.value.param == "tools[2].format.definition"
    assert "apply_patch" in caught.value.message


@pytest.mark.parametrize(
    "definition", ["(a|aa)*(a|aa)*(a|aa)*b", "(x+x+)+y", "[a-z]{1,1000}[0-9]{1,1000}"]
)
def test_a_pathological_regex_compiles_in_bounded_time(
    compiler: tuple[GrammarCompiler, Any], definition: str
) -> None:
    grammars, hf = compiler
    started = time.monotonic()
    tool = CustomGrammar("t", "regex", definition, "tools[0].format")
    try:
        grammar = grammars.compile_custom_tools([tool], [], _tokens(hf))
    except InvalidRequest:
        grammar = None
    if grammar is not None:
        assert _accepts(compiler, grammar, _call("t", "a" * 40)) is False
    assert time.monotonic() - started < 5


def test_a_slash_escaped_inside_a_lark_regex_is_a_slash(
    compiler: tuple[GrammarCompiler, Any],
) -> None:
    grammar = _reply_grammar(compiler, CustomGrammar("t", "lark", r"start: /a\/b/", "t"))
    assert _accepts(compiler, grammar, _call("t", "a/b"))
    assert not _accepts(compiler, grammar, _call("t", "ab"))


def test_a_call_tag_spelled_with_ordinary_tokens_is_refused(
    compiler: tuple[GrammarCompiler, Any],
) -> None:
    grammars, hf = compiler
    grammar = _reply_grammar(compiler, CustomGrammar("shout", "regex", "[A-Z]+", "t"))
    spelled = hf.encode("<", add_special_tokens=False) + hf.encode(
        'tool_call>\n{"name": "shout", "arguments": {"input": "hey"}}', add_special_tokens=False
    )
    matcher = grammars.matcher(grammar)
    assert not all(matcher.consume_token(t) for t in spelled)
    inside = '<tool_call>\n{"name": "get_weather", "arguments": "</tool_call> <tool_call>"}'
    assert not _accepts(compiler, grammar, inside + "\n</tool_call>")


def test_only_tools_with_a_grammar_lose_the_bare_call_fallback(
    compiler: tuple[GrammarCompiler, Any],
) -> None:
    from mlxcel.model.prompt import TemplateCodec
    from mlxcel.prepare.tools import tool_use

    grammars, hf = compiler
    codec = TemplateCodec(hf, grammars)
    tools: list[dict[str, Any]] = [
        {
            "type": "custom",
            "name": "held",
            "format": {"type": "grammar", "syntax": "regex", "definition": "[a-z]+"},
        },
        {"type": "custom", "name": "free"},
    ]
    _, use, grammar = tool_use(tools, "auto", codec, parser="hermes")  # type: ignore[arg-type]
    assert grammar is not None
    assert use is not None
    assert use.held == frozenset({"held"})
    _, other, none = tool_use(tools, "auto", codec, parser="llama3")  # type: ignore[arg-type]
    assert none is None
    assert other is not None
    assert other.held == frozenset()
