"""Structured output: JSON-schema grammars enforced on the logits with llguidance.

llguidance compiles a JSON schema into a grammar and, step by step, tells which tokens
may come next. `GrammarMasks` turns the bitmasks of a whole batch into one MLX mask per
decode step (`GrammarProcessor` does the same for one sequence, as an mlx-lm logits
processor). Masks are applied with plain MLX array operations, so they run on MLX's CPU
backend here and on Apple GPUs alike (llguidance's own MLX helper needs Metal). Grammars
are compiled and validated when the request arrives, so a bad schema is a 400, never a
failed generation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import llguidance
import llguidance.numpy
import numpy as np

if TYPE_CHECKING:
    import mlx.core as mx
    from llguidance._lib import JsonCompileOptions

from mlxcel.errors import InvalidRequest
from mlxcel.generation import CustomGrammar
from mlxcel.model.grammar.tool_grammars import call_opening, hermes_reply, invalid_grammar, validate

MAX_SCHEMA_BYTES = 64 * 1024
PROBE_STEPS = 4
"""Tokens of a custom tool's input the request-time check reads (`_first_steps`)."""


# Compact JSON (", " and ": " separators, no other whitespace): a model cannot pad its
# answer with endless whitespace, and the output reads like `json.dumps`.
COMPACT_JSON: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}


def _schema_text(schema: Mapping[str, Any]) -> str:
    text = json.dumps(schema)
    if len(text) > MAX_SCHEMA_BYTES:
        raise InvalidRequest(
            f"The JSON schema is {len(text)} bytes; at most {MAX_SCHEMA_BYTES} are accepted.",
            param="text.format.schema",
            code="invalid_json_schema",
        )
    return text


def json_schema_grammar(schema: Mapping[str, Any]) -> str:
    """The llguidance grammar for output that validates against `schema`."""
    text = _schema_text(schema)
    return str(llguidance.LLMatcher.grammar_from_json_schema(text, defaults=COMPACT_JSON))


def tagged_call_grammar(schema: Mapping[str, Any], open_token: int, close_token: int) -> str:
    """One call in the Hermes form: the `<tool_call>` token, a newline, a JSON call
    valid against `schema`, a newline and the `</tool_call>` token (tokens by id: the
    tokenizer keeps them whole, so their text must not be spelled out byte by byte)."""
    body = _schema_text({**schema, "x-guidance": COMPACT_JSON})
    lark = f'start: <[{open_token}]> "\\n" call "\\n" <[{close_token}]>\ncall: %json {body}'
    return str(llguidance.LLMatcher.grammar_from_lark(lark))


def compile_schema(
    schema: Mapping[str, Any], tokenizer: llguidance.LLTokenizer | None = None
) -> str:
    """The grammar for `schema`, validated (against `tokenizer` when given); 400 if bad."""
    grammar = json_schema_grammar(schema)
    error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
    if error:
        raise InvalidRequest(
            f"Invalid JSON schema: {error}",
            param="text.format.schema",
            code="invalid_json_schema",
        )
    return grammar


class GrammarCompiler:
    """Compiles schemas against the model's tokenizer and makes logits processors."""

    def __init__(self, tokenizer: llguidance.LLTokenizer) -> None:
        self._tokenizer = tokenizer

    @classmethod
    def for_hf_tokenizer(cls, hf_tokenizer: Any) -> GrammarCompiler:
        import llguidance.hf

        return cls(llguidance.hf.from_tokenizer(hf_tokenizer))

    def compile_schema(self, schema: Mapping[str, Any]) -> str:
        return compile_schema(schema, self._tokenizer)

    def compile_tagged_call(
        self, schema: Mapping[str, Any], open_token: int, close_token: int
    ) -> str:
        grammar = tagged_call_grammar(schema, open_token, close_token)
        error = llguidance.LLMatcher.validate_grammar(grammar, self._tokenizer)
        if error:
            raise InvalidRequest(f"Invalid JSON schema: {error}", code="invalid_json_schema")
        return grammar

    def compile_custom_tools(
        self,
        custom: Sequence[CustomGrammar],
        others: Sequence[str],
        tokens: tuple[int, int] | None,
        *,
        call_schema: Mapping[str, Any] | None = None,
        required: bool = False,
    ) -> str | None:
        """Each custom tool's grammar validated (400 naming the tool), then the reply's
        grammar in the Hermes form when the call `tokens` are known (`tool_grammars`):
        each tool's call checked alone first, so a grammar that cannot hold its call is
        a 400 naming it, never a call left free."""
        for tool in custom:
            validate(tool, self._tokenizer)
        if tokens is None:
            return None
        for tool in custom:
            self._check_call(tool, tokens)
        grammar = hermes_reply(custom, others, tokens, call_schema=call_schema, required=required)
        error = llguidance.LLMatcher.validate_grammar(grammar, self._tokenizer)
        if error:  # each call holds alone: the other tools' parameters do not compile
            raise InvalidRequest(
                f"Invalid tool parameters: {error[:500]}",
                param="tools",
                code="invalid_tool_parameters",
            )
        return grammar

    def _check_call(self, tool: CustomGrammar, tokens: tuple[int, int]) -> None:
        """400 naming `tool` unless a reply that must call it compiles and its matcher
        reads into the input: a grammar whose parse outgrows llguidance's per-step
        limits (a long run it forces, deep ambiguity) mostly does so right there, and a
        matcher in error holds nothing (`GrammarMasks` lets such a row free)."""
        grammar = hermes_reply([tool], [], tokens, required=True)
        error = llguidance.LLMatcher.validate_grammar(grammar, self._tokenizer)
        if not error:
            opening = [tokens[0], *self._tokenizer.tokenize_str(call_opening(tool.name))]
            error = self._first_steps(grammar, opening)
        if error:
            raise invalid_grammar(tool, f"it cannot be enforced on the call: {error}")

    def _first_steps(self, grammar: str, opening: list[int]) -> str:
        """The error (or "") of a matcher fed `opening`, then `PROBE_STEPS` tokens of
        the input, each the lowest one its mask allows (one path of many: a check, not
        a proof)."""
        matcher = self.matcher(grammar)
        for step in range(len(opening) + PROBE_STEPS):
            mask = matcher.compute_bitmask()  # where tokens forced ahead are worked out
            if matcher.is_error():
                break
            token = opening[step] if step < len(opening) else _lowest(mask)
            if token is None or not matcher.consume_token(token):
                break
        return matcher.get_error() if matcher.is_error() else ""

    def matcher(self, grammar: str) -> llguidance.LLMatcher:
        """A fresh matcher for one sequence constrained by `grammar` (a compiled grammar)."""
        return llguidance.LLMatcher(self._tokenizer, grammar)

    def masks(self, vocab_size: int) -> GrammarMasks:
        """Batch masks over logits `vocab_size` wide, for matchers made by `matcher`."""
        return GrammarMasks(vocab_size, self._tokenizer)

    def processor(self, grammar: str) -> GrammarProcessor:
        return GrammarProcessor(self.matcher(grammar))


class GrammarMasks:
    """The tokens each row of a batch may sample next, for one decode step at a time.

    One llguidance call fills the bitmasks of every constrained row in parallel (it
    drops the GIL and spreads the rows over its threads); a few MLX operations over the
    whole batch then unpack the 32-bit words into a `[B, V]` bool mask. Rows without a
    matcher, and rows whose matcher is in an error state, allow every token: a grammar
    must never stop a generation, which ends by its own limits instead.

    `vocab_size` is the logits' width, which may exceed the tokenizer's vocabulary
    (embedding tables are padded); tokens past the tokenizer's are never allowed in a
    constrained row, since no grammar can account for them.

    Masking never advances a matcher: after sampling, the caller feeds each constrained
    row's token to its matcher with `matcher.consume_token(token)` before the next call.
    """

    def __init__(self, vocab_size: int, tokenizer: llguidance.LLTokenizer) -> None:
        import mlx.core as mx

        self.vocab_size = vocab_size
        self._words = (tokenizer.vocab_size + 31) // 32
        """llguidance writes exactly this many words per row."""
        self._padded = max(self._words, (vocab_size + 31) // 32)
        """Words once widened to cover the logits."""
        self._executor = llguidance.LLExecutor()
        self._bits = mx.left_shift(mx.array(1, mx.uint32), mx.arange(32, dtype=mx.uint32))

    def allowed(self, matchers: Sequence[llguidance.LLMatcher | None]) -> mx.array:
        """`[B, V]` bool, True where row b may sample token v next (one row per matcher)."""
        import mlx.core as mx

        rows = len(matchers)
        live = [(m, b) for b, m in enumerate(matchers) if m is not None and not m.is_error()]
        words = np.zeros((rows, self._padded), dtype=np.uint32)  # zero past the tokenizer
        if live:
            filled = np.zeros((rows, self._words), dtype=np.int32)
            llguidance.numpy.fill_next_token_bitmask_par(self._executor, live, filled)
            words[:, : self._words] = filled.view(np.uint32)  # its last word: tail bits 0
        free = np.ones(rows, dtype=np.bool_)
        free[[b for _, b in live]] = False
        bits = (mx.array(words)[:, :, None] & self._bits) != 0
        bits = bits.reshape(rows, 32 * self._padded)[:, : self.vocab_size]
        return mx.logical_or(bits, mx.array(free)[:, None])

    def apply(self, logits: mx.array, matchers: Sequence[llguidance.LLMatcher | None]) -> mx.array:
        """`logits` `[B, V]` with the tokens each row's grammar forbids set to -inf.

        Logits come back untouched when no row is constrained."""
        import mlx.core as mx

        if all(m is None or m.is_error() for m in matchers):
            return logits
        neg_inf = mx.array(-float("inf"), dtype=logits.dtype)
        return mx.where(self.allowed(matchers), logits, neg_inf)


class GrammarProcessor:
    """An mlx-lm logits processor that allows only tokens the grammar accepts next.

    It sees the tokens so far at every step; the last one is the token sampled after
    the previous call, which it feeds to the matcher before masking the next logits.
    """

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._matcher = matcher
        self._started = False
        self._index: Any = None
        self._shift: Any = None

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx

        if self._started:
            self._matcher.consume_token(int(tokens[-1].item()))
        self._started = True
        if self._matcher.is_error():  # cannot happen while masking; never block generation
            return logits
        words = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint32)
        vocab = logits.shape[-1]
        if self._index is None:
            ids = mx.arange(vocab, dtype=mx.uint32)
            self._index = mx.minimum(ids // 32, len(words) - 1)
            self._shift = ids % 32
            self._known = ids < 32 * len(words)
        bits = (mx.array(words)[self._index] >> self._shift) & 1
        allowed = mx.logical_and(bits.astype(mx.bool_), self._known)
        return mx.where(allowed, logits, mx.array(-float("inf"), dtype=logits.dtype))


def _lowest(mask: bytes) -> int | None:
    """The lowest token a bitmask allows (None when it allows none)."""
    allowed = np.flatnonzero(np.unpackbits(np.frombuffer(mask, np.uint8), bitorder="little"))
    return int(allowed[0]) if allowed.size else None
