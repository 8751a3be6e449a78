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
grammar of that one terminal). Each grammar is validated
alone first: an invalid one is a 400 naming its tool. One the rewrite cannot carry is
shown to the model but not enforced (logged), and so is every grammar of a model whose
calls are not written in the Hermes form.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import llguidance

from mlxcel.errors import InvalidRequest
from mlxcel.generation import CustomGrammar
from mlxcel.model.json_quote import Unquotable, quote_lark, quote_regex

log = logging.getLogger(__name__)

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
        raise _invalid(custom, f"it is longer than {MAX_GRAMMAR_BYTES} bytes")
    try:
        if custom.syntax == "lark":
            return str(llguidance.LLMatcher.grammar_from_lark(custom.definition))
        return str(llguidance.LLMatcher.grammar_from_regex(custom.definition))
    except (ValueError, RuntimeError) as exc:
        raise _invalid(custom, str(exc)) from None


def validate(custom: CustomGrammar, tokenizer: llguidance.LLTokenizer | None) -> None:
    """400 for a grammar llguidance refuses (against `tokenizer` when given)."""
    error = llguidance.LLMatcher.validate_grammar(tool_grammar(custom), tokenizer)
    if error:
        raise _invalid(custom, error)


def _invalid(custom: CustomGrammar, why: str) -> InvalidRequest:
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


def hermes_reply(
    custom: Sequence[CustomGrammar],
    others: Sequence[str],
    tokens: tuple[int, int],
    *,
    call_schema: Mapping[str, Any] | None = None,
    required: bool = False,
) -> str | None:
    """The llguidance grammar of a reply in the Hermes form whose calls to `custom`
    tools follow their grammars (see the module's docstring); None when no grammar
    can be carried."""
    rules: list[str] = []
    subs: list[dict[str, str]] = []
    enforced: list[str] = []
    free = list(others)
    for k, tool in enumerate(custom):
        try:
            value = _value(tool, k, subs)
        except Unquotable as exc:
            log.warning("custom tool %r: grammar not enforced (%s)", tool.name[:64], exc)
            free.append(tool.name)
            continue
        rules.append(f"tool_{k}: {_lit(_opening(tool.name))} {value} {_lit(CALL_CLOSING)}")
        enforced.append(tool.name)
    if not enforced:
        return None
    bodies = [f"tool_{k}" for k, t in enumerate(custom) if t.name in enforced]
    if required and call_schema is not None:
        schema = json.dumps({**call_schema, "x-guidance": COMPACT_JSON})
        rules.append(f'other: "\\n" %json {schema} "\\n"')
        bodies.append("other")
    elif free and not required:
        names = " | ".join(_lit(json.dumps(n)[1:-1]) for n in free)
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


def enforceable(tool: CustomGrammar) -> bool:
    """Whether the rewrite carries the tool's grammar (else it is shown, not enforced)."""
    try:
        _value(tool, 0, [])
    except Unquotable:
        return False
    return True


def _value(tool: CustomGrammar, k: int, subs: list[dict[str, str]]) -> str:
    """The Lark expression of the tool's input as a JSON string (quotes included)."""
    if tool.syntax == "regex":
        quoted = "start: " + quote_regex(tool.definition)
    else:
        quoted = quote_lark(tool.definition)
    subs.append({"name": f"g{k}", "lark_grammar": quoted})
    return f'"\\"" @g{k} "\\""'
