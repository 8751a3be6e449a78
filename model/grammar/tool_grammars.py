"""Enforcing `custom` tools' grammars while the model writes its calls (llguidance).

A custom tool is shown to the model as a function with one string argument, `input`
(`prepare/custom_tools.py`). The default model writes calls in the Hermes form, so a
reply that may call such a tool is decoded under this grammar:

    start: TEXT (call TEXT)*                       (`required`: one `call`, no text)
    call:  <tool_call> ( tool_0 | tool_1 | … | other ) </tool_call>
    tool_k: "\\n{\\"name\\": \\"NAME\\", \\"arguments\\": {\\"input\\": \\"" @g_k "\\"}}\\n"
    other: "\\n{\\"name\\": \\"" ("f" | "g" | …) "\\"" REST

Text outside calls is free but for the call tags' own text (the tags must come as
their special tokens, which is where the grammar takes hold), a
call to another tool is free after its name (or, when the reply must call, valid
against the calls' schema, as `tagged_call_grammar` does), and a call to a custom tool
with a grammar is its exact JSON with the input written under that grammar, rewritten
for the JSON string (`json_quote.py`), as a sub-grammar `@g_k` (a `regex` is the
grammar of that one terminal). Each grammar is validated alone first: an invalid one is
a 400 naming its tool, and so is one the rewrite cannot carry, since a grammar that is
offered must hold the call (a call left free would be the only sign that it did not).
A model whose calls are not written in the Hermes form is shown each grammar in its
tool's description only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import llguidance

from mlxcel.errors import InvalidRequest
from mlxcel.generation import CustomGrammar
from mlxcel.model.grammar.json_quote import Unquotable, quote_lark, quote_regex

MAX_GRAMMAR_BYTES = 64 * 1024
"""A custom tool's grammar definition may be at most this long."""
NAME_OPENING = '\n{"name": "'
CALL_CLOSING = "}}\n"
FREE = r"/(?s:.*)/ & ~/(?s:.*<\/?tool_call>.*)/"
"""Free text that does not spell a call tag: the parser reads the tags' text, so a tag
written with ordinary tokens would open a call no grammar holds."""
COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def tool_grammar(custom: CustomGrammar) -> str:
    """`custom`'s own grammar, as llguidance compiles it (400 when it cannot)."""
    if len(custom.definition.encode()) > MAX_GRAMMAR_BYTES:
        raise invalid_grammar(custom, f"it is longer than {MAX_GRAMMAR_BYTES} bytes")
    try:
        if custom.syntax == "lark":
            return str(llguidance.LLMatcher.grammar_from_lark(custom.definition))
        return str(llguidance.LLMatcher.grammar_from_regex(custom.definition))
    except (ValueError, RuntimeError) as exc:
        raise invalid_grammar(custom, str(exc)) from None


def validate(custom: CustomGrammar, tokenizer: llguidance.LLTokenizer | None) -> None:
    """400 for a grammar llguidance refuses (against `tokenizer` when given)."""
    error = llguidance.LLMatcher.validate_grammar(tool_grammar(custom), tokenizer)
    if error:
        raise invalid_grammar(custom, error)


def check_quotable(custom: CustomGrammar) -> None:
    """400 for a grammar the rewrite for the call's JSON string cannot carry."""
    _value(custom, 0, [])


def invalid_grammar(custom: CustomGrammar, why: str) -> InvalidRequest:
    """The 400 naming `custom`'s definition."""
    return InvalidRequest(
        f"Invalid {custom.syntax} grammar for the custom tool {custom.name[:64]!r}: {why[:500]}",
        param=f"{custom.param}.definition",
        code="invalid_grammar",
    )


def _lit(text: str) -> str:
    """A Lark string literal for `text`."""
    return json.dumps(text, ensure_ascii=False)


def _opening(name: str) -> str:
    return "\n" + json.dumps({"name": name})[:-1] + ', "arguments": {"input": '


def call_opening(name: str) -> str:
    """A call's text after its `<tool_call>` token, up to the first character of its
    input (`name`'s tool held to a grammar)."""
    return _opening(name) + '"'


def hermes_reply(
    custom: Sequence[CustomGrammar],
    others: Sequence[str],
    tokens: tuple[int, int],
    *,
    call_schema: Mapping[str, Any] | None = None,
    required: bool = False,
) -> str:
    """The llguidance grammar of a reply in the Hermes form whose calls to `custom`
    tools follow their grammars (see the module's docstring); 400 naming the first
    grammar the rewrite cannot carry."""
    rules: list[str] = []
    subs: list[dict[str, str]] = []
    for k, tool in enumerate(custom):
        value = _value(tool, k, subs)
        rules.append(f"tool_{k}: {_lit(_opening(tool.name))} {value} {_lit(CALL_CLOSING)}")
    bodies = [f"tool_{k}" for k in range(len(custom))]
    if required and call_schema is not None:
        schema = json.dumps({**call_schema, "x-guidance": COMPACT_JSON})
        rules.append(f'other: "\\n" %json {schema} "\\n"')
        bodies.append("other")
    elif others and not required:
        names = " | ".join(_lit(json.dumps(n)[1:-1]) for n in others)
        rules += [f'other: {_lit(NAME_OPENING)} ({names}) "\\"" REST', f"REST: {FREE}"]
        bodies.append("other")
    open_token, close_token = tokens
    rules.append(f"call: <[{open_token}]> ({' | '.join(bodies)}) <[{close_token}]>")
    main = "\n".join([_head(required), *rules])
    return json.dumps({"grammars": [{"lark_grammar": main}, *subs]})


def _head(required: bool) -> str:
    """The reply: one tagged call (`required`), or text and tagged calls. (A reply that
    is only a bare or fenced JSON call is text here: free text is one greedy lexeme, so
    no grammar could hold such a call, and the builder does not read it as one.)"""
    if required:
        return "start: call"
    return f"start: TEXT (call TEXT)*\nTEXT: {FREE}"


def _value(tool: CustomGrammar, k: int, subs: list[dict[str, str]]) -> str:
    """The Lark expression of the tool's input as a JSON string (quotes included)."""
    try:
        if tool.syntax == "regex":
            quoted = "start: " + quote_regex(tool.definition)
        else:
            quoted = quote_lark(tool.definition)
    except Unquotable as exc:
        raise invalid_grammar(tool, f"it cannot be enforced on the call: {exc}") from None
    subs.append({"name": f"g{k}", "lark_grammar": quoted})
    return f'"\\"" @g{k} "\\""'
