"""A custom tool's grammar, rewritten to hold the JSON string that carries its input.

The model writes a custom tool's input as the string argument `input` of a function
call (`prepare/custom_tools.py`), so while it writes, the text is JSON-escaped: a newline
is the two characters `\\n`, a quote `\\"`. Escaping is one fixed replacement per
character, so a grammar over the input becomes a grammar over the escaped text by
rewriting each of its terminals: every string literal is escaped, and every regex
matches the escaped form of what it matched (`quote_regex`). Rules are left as they
are. The escaped form is the canonical one `json.dumps(..., ensure_ascii=False)`
writes: `\\"`, `\\\\`, `\\b`, `\\f`, `\\n`, `\\r`, `\\t`, and `\\u00XX` for the other
control characters; anything else as itself.

What cannot be rewritten faithfully raises `Unquotable` (the request is then a 400
naming the tool's definition): a case-insensitive literal or regex, regex flags other
than `s` and `x`, anchors or lookarounds inside a regex, a repetition above
`MAX_REPEAT`, `%ignore`, `%json`, `%regex`, special tokens, grammar references, Unicode
classes (`\\p{..}`) and terminals imported from anywhere but `common`'s simple ones.
"""

from __future__ import annotations

import json
import re
import warnings
from re import _constants as sre_c  # type: ignore[attr-defined]
from re import _parser as sre_p  # type: ignore[attr-defined]
from typing import Any

# The standard library's regex parser: its tree is read here, so no regex syntax is
# re-implemented.

SPECIAL = frozenset(chr(c) for c in range(0x20)) | {'"', "\\"}
"""The characters JSON escapes; every other one stands for itself."""
_SHORT = {'"': '"', "\\": "\\", "\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}
_NOT_SPECIAL = r"\x00-\x1F\x22\x5C"
_SPACE = frozenset("\t\n\x0b\x0c\r")
"""The special characters `\\s` matches (Rust's Unicode `\\s`)."""

COMMON = {
    "LF": r"\n",
    "CR": r"\r",
    "NEWLINE": r"(?:\r?\n)+",
    "WS": r"[ \t\f\r\n]+",
    "WS_INLINE": r"[ \t]+",
    "DIGIT": r"[0-9]",
    "HEXDIGIT": r"[a-fA-F0-9]",
    "INT": r"[0-9]+",
    "SIGNED_INT": r"[+-]?[0-9]+",
    "LETTER": r"[a-zA-Z]",
    "WORD": r"[a-zA-Z]+",
    "LCASE_LETTER": r"[a-z]",
    "UCASE_LETTER": r"[A-Z]",
    "CNAME": r"[_a-zA-Z][_a-zA-Z0-9]*",
}
"""The terminals of Lark's `common` grammar this rewrite knows, as regexes."""


MAX_REPEAT = 1000
"""Bounded regex repetitions above this are refused: the rewritten grammar is parsed one
character at a time, so each step's cost grows with a long repetition, and a long fixed
run, forced ahead of the model at once, outgrows llguidance's per-step limits (at some
tens of thousands of characters)."""
_FLAGS = re.DOTALL | re.VERBOSE | re.UNICODE
"""The flags a regex may carry (`UNICODE` is every `str` pattern's)."""


class Unquotable(ValueError):
    """The grammar uses something the rewrite cannot carry into the escaped form."""


def escaped(char: str) -> str:
    """`char` as JSON writes it inside a string."""
    if char in _SHORT:
        return "\\" + _SHORT[char]
    return f"\\u{ord(char):04x}" if char in SPECIAL else char


def _escape_rx(char: str) -> str:
    """A regex matching exactly the JSON escape of the special `char` (either case of
    the hex digits in `\\u00XX`)."""
    text = escaped(char)
    if not text.startswith("\\u"):
        return "".join(literal_rx(c) for c in text)
    digits = "".join(f"[{d.lower()}{d.upper()}]" if d.isalpha() else d for d in text[2:])
    return r"\\u" + digits


def literal_rx(char: str) -> str:
    """A regex matching exactly `char`."""
    return char if char.isalnum() or char == "_" else f"\\x{{{ord(char):X}}}"


def _escapes(chars: set[str]) -> str:
    return "|".join(_escape_rx(c) for c in sorted(chars))


def _either(plain: str | None, specials: set[str]) -> str:
    """A lexeme of one character: one of the class `plain` (no specials in it), or the
    escape of one of `specials`."""
    parts = ([plain] if plain else []) + ([_escapes(specials)] if specials else [])
    if not parts:
        return "/[^\\x00-\\x{10FFFF}]/"  # matches nothing
    return "/" + (parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")") + "/"


def quote_regex(pattern: str, flags: str = "") -> str:
    """A Lark expression matching the JSON-escaped form of exactly the strings
    `pattern` matches whole. It is built of one-character lexemes, not one regex: in
    the escaped form a backslash may start an escape inside the regex's text or the
    next terminal (`\\n` of a newline), which one greedy lexeme could not tell apart."""
    if "i" in flags:
        raise Unquotable("case-insensitive regexes are not supported")
    if "\\p" in pattern or "\\P" in pattern or "[:" in pattern:
        raise Unquotable("Unicode and POSIX classes are not supported")
    py_flags = (re.DOTALL if "s" in flags else 0) | (re.VERBOSE if "x" in flags else 0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # set operations (`&&`, `--`) parse as literals
            tree = sre_p.parse(pattern, py_flags)
    except (re.error, FutureWarning, RecursionError) as exc:
        raise Unquotable(f"regex {pattern[:64]!r}: {exc}") from None
    if tree.state.flags & ~_FLAGS:  # a leading `(?i)`, `(?a)`, `(?m)`…: the whole regex's
        raise Unquotable("inline flags other than s and x are not supported")
    return "(" + _seq(list(tree), bool(tree.state.flags & re.DOTALL)) + ")"


def _seq(items: list[Any], dotall: bool) -> str:
    return " ".join(_node(op, arg, dotall) for op, arg in items) or '""'


def _node(op: Any, arg: Any, dotall: bool) -> str:
    if op is sre_c.LITERAL:
        char = chr(arg)
        return _either(None, {char}) if char in SPECIAL else f"/{literal_rx(char)}/"
    if op is sre_c.NOT_LITERAL:
        char = chr(arg)
        return _either(f"[^{literal_rx(char)}{_NOT_SPECIAL}]", set(SPECIAL) - {char})
    if op is sre_c.ANY:
        return _either(f"[^{_NOT_SPECIAL}]", set(SPECIAL) - (set() if dotall else {"\n"}))
    if op is sre_c.IN:
        return _charset(arg)
    if op is sre_c.BRANCH:
        return "(" + " | ".join(_seq(list(alt), dotall) for alt in arg[1]) + ")"
    if op is sre_c.SUBPATTERN:
        _, add, remove, inner = arg
        if (add | remove) & ~(re.DOTALL | re.VERBOSE):
            raise Unquotable("inline flags other than s and x are not supported")
        inner_dotall = (dotall or bool(add & re.DOTALL)) and not remove & re.DOTALL
        return "(" + _seq(list(inner), inner_dotall) + ")"
    if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT):
        low, high, inner = arg
        return _repeat("(" + _seq(list(inner), dotall) + ")", low, high)
    raise Unquotable(f"regex construct {str(op).lower()} is not supported")


def _repeat(item: str, low: int, high: int) -> str:
    unbounded = high == sre_c.MAXREPEAT
    if unbounded and low <= 1:
        return item + ("*" if low == 0 else "+")
    if (low, high) == (0, 1):
        return item + "?"
    if low > MAX_REPEAT or (not unbounded and high > MAX_REPEAT):
        raise Unquotable(f"repetitions above {MAX_REPEAT} are not supported")
    if unbounded:
        return f"{item} ~ {low} {item}*"
    return f"{item} ~ {low}..{high}" if high != low else f"{item} ~ {low}"


def _charset(items: list[tuple[Any, Any]]) -> str:
    """A class `[...]`: its members that need no escape, or the escapes of the special
    characters it holds."""
    negated = bool(items) and items[0][0] is sre_c.NEGATE
    members = items[1:] if negated else items
    parts: list[str] = []
    specials: set[str] = set()
    for op, arg in members:
        if op is sre_c.LITERAL:
            parts.append(literal_rx(chr(arg)))
            specials |= {chr(arg)} & SPECIAL
        elif op is sre_c.RANGE:
            low, high = arg
            parts.append(f"{literal_rx(chr(low))}-{literal_rx(chr(high))}")
            specials |= {c for c in SPECIAL if low <= ord(c) <= high}
        elif op is sre_c.CATEGORY:
            text, held = _category(arg)
            parts.append(text)
            specials |= held
        else:
            raise Unquotable(f"class member {str(op).lower()} is not supported")
    inside = "".join(parts)
    if negated:
        return _either(f"[^{inside}{_NOT_SPECIAL}]", set(SPECIAL) - specials)
    return _either(f"[{inside}&&[^{_NOT_SPECIAL}]]" if inside else None, specials)


def _category(code: Any) -> tuple[str, set[str]]:
    """A class escape and the special characters it matches."""
    name = str(code).upper()
    for key, text in (("DIGIT", "d"), ("WORD", "w"), ("SPACE", "s")):
        if key in name:
            held = set(_SPACE) if key == "SPACE" else set()
            if "NOT" in name:
                return "\\" + text.upper(), set(SPECIAL) - held
            return "\\" + text, held
    raise Unquotable(f"class {name.lower()} is not supported")


# --- Lark grammars ----------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<comment>//[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"i?)
  | (?P<regex>/(?![/*])(?:[^/\\\n]|\\.)+/[imslux]*)
  | (?P<directive>%[a-z]+)
  | (?P<special><[^>\n]*>)
  | (?P<ref>@[A-Za-z0-9_]+)
  | (?P<range>\.\.)
  | (?P<other>[^"/%<@.]+|[.%<@/])
    """,
    re.VERBOSE,
)
_TERMINAL = re.compile(r"\b_?[A-Z][A-Z0-9_]*\b")
"""A terminal's name: each becomes a rule, since what it matches is no longer one
regex but a sequence of one-character lexemes (`quote_regex`), named in lower case
after a prefix none of the grammar's own names begins with (`_prefix`)."""
_IMPORT = re.compile(r"%import\s+common\.([A-Z_]+)[ \t]*(?://[^\n]*)?$", re.MULTILINE)


def quote_lark(grammar: str) -> str:
    """The Lark grammar (llguidance's dialect) over the JSON-escaped form of the text
    `grammar` accepts; `Unquotable` when it uses what the rewrite cannot carry."""
    grammar = _IMPORT.sub(_imported, grammar)
    prefix = _prefix(grammar)
    out: list[str] = []
    tokens = [(m.lastgroup, m.group()) for m in _TOKEN.finditer(grammar)]
    if sum(len(text) for _, text in tokens) != len(grammar):
        raise Unquotable("the grammar could not be read")
    index = 0
    while index < len(tokens):
        kind, text = tokens[index]
        if kind == "string":
            after = _skip_space(tokens, index + 1)
            if after < len(tokens) and tokens[after][0] == "range":
                end = _skip_space(tokens, after + 1)
                out.append(_range(text, tokens[end][1] if end < len(tokens) else ""))
                index = end + 1
                continue
            out.append(_quote_string(text))
        elif kind == "regex":
            body, _, flags = text[1:].rpartition("/")
            out.append(quote_regex(body.replace("\\/", "/"), flags))
        elif kind in ("directive", "special", "ref"):
            raise Unquotable(f"{text[:32]!r} is not supported in an enforced grammar")
        else:
            out.append(_TERMINAL.sub(lambda m: prefix + m.group().lower(), text))
        index += 1
    return "".join(out)


def _prefix(grammar: str) -> str:
    """`term_`, or a longer prefix when a name of `grammar` begins with it: a rule named
    `term_a` next to a terminal `A` would otherwise be defined twice."""
    prefix = "term_"
    while re.search(rf"\b{prefix}", grammar, re.IGNORECASE):
        prefix = "t" + prefix
    return prefix


def _skip_space(tokens: list[tuple[str | None, str]], index: int) -> int:
    while index < len(tokens) and tokens[index][0] == "other" and not tokens[index][1].strip():
        index += 1
    return index


def _imported(found: re.Match[str]) -> str:
    name = found.group(1)
    if name not in COMMON:
        raise Unquotable(f"%import common.{name} is not supported")
    return f"{name}: /{COMMON[name]}/"  # quoted with the other regexes


def _value(literal: str) -> str:
    if literal.endswith("i"):
        raise Unquotable("case-insensitive literals are not supported")
    try:
        value = json.loads(literal)
    except ValueError:
        raise Unquotable(f"the literal {literal[:32]} could not be read") from None
    if not isinstance(value, str):
        raise Unquotable(f"the literal {literal[:32]} could not be read")
    return value


def _quote_string(literal: str) -> str:
    value = _value(literal)
    quoted = "".join(escaped(c) for c in value)
    return json.dumps(quoted, ensure_ascii=False)


def _range(low: str, high: str) -> str:
    first, last = _value(low), _value(high) if high.startswith('"') else ""
    if len(first) != 1 or len(last) != 1:
        raise Unquotable("a range needs two one-character literals")
    return quote_regex(f"[{re.escape(first)}-{re.escape(last)}]")
