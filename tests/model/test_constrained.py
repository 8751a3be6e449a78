"""Structured output: grammars from JSON schemas, enforced on a real (tiny) MLX model.

The tiny model has random weights, so whatever it says is the grammar's doing: if its
output always validates, the constraint holds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import llguidance
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlxcel.config import Settings
from mlxcel.errors import InvalidRequest
from mlxcel.generation import Sampling, SequenceSpec
from mlxcel.model.engine import LoadedModel
from mlxcel.model.grammar.constrained import GrammarCompiler, GrammarProcessor, compile_schema
from mlxcel.model.native.blas import load_fast_blas
from mlxcel.respond.tool_parsers import CallClosed, HermesToolParser

from tiny_model import ensure_tiny_model

pytestmark = pytest.mark.mlx

LEAVES: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.just({"type": "integer"}),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 6)),
    st.builds(
        lambda values: {"enum": values},
        st.lists(st.text("abcxyz", min_size=1, max_size=4), min_size=1, max_size=3, unique=True),
    ),
    st.builds(
        lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
        st.integers(-50, 50),
        st.integers(0, 100),
    ),
)


def objects(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), children, max_size=3).map(
        lambda props: {
            "type": "object",
            "properties": props,
            "required": sorted(props),
            "additionalProperties": False,
        }
    )


SCHEMAS = st.recursive(
    LEAVES,
    lambda children: st.one_of(
        objects(children),
        st.builds(
            lambda item, n: {"type": "array", "items": item, "maxItems": n},
            children,
            st.integers(0, 3),
        ),
    ),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    load_fast_blas()
    from mlxcel.model.mlx_load import load_mlx_model

    return load_mlx_model(
        ensure_tiny_model(),
        name="tiny",
        max_batch=4,
        prefill_step_size=64,
        blas=load_fast_blas(),
        prompt_cache_bytes=Settings().prompt_cache_bytes,
    )


def generate(tiny: LoadedModel, grammar: str, seq_id: int, max_tokens: int = 160) -> str:
    prompt = tuple(tiny.codec.render([{"role": "user", "content": "json please"}], None))
    tiny.engine.insert(
        SequenceSpec(
            seq_id, prompt, Sampling(temperature=1.0, max_tokens=max_tokens, grammar=grammar)
        )
    )
    steps = []
    while tiny.engine.has_work():
        steps.extend(s for s in tiny.engine.step() if s.seq_id == seq_id)
    assert steps[-1].finish == "stop", "".join(s.text for s in steps)
    return "".join(s.text for s in steps)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(schema=SCHEMAS, seed=st.integers(0, 2**16))
def test_constrained_output_always_validates(
    tiny: LoadedModel, schema: dict[str, Any], seed: int
) -> None:
    grammar = tiny.codec.compile_schema(schema)
    text = generate(tiny, grammar, seed)
    jsonschema.validate(json.loads(text), schema)


def test_a_batch_of_different_grammars(tiny: LoadedModel) -> None:
    schemas = [
        {
            "type": "object",
            "properties": {"k": {"type": "boolean"}},
            "required": ["k"],
            "additionalProperties": False,
        },
        {"type": "array", "items": {"type": "boolean"}, "maxItems": 4},
        {"enum": ["red", "green"]},
    ]
    prompt = tuple(tiny.codec.render([{"role": "user", "content": "x"}], None))
    for i, schema in enumerate(schemas):
        grammar = tiny.codec.compile_schema(schema)
        tiny.engine.insert(SequenceSpec(100 + i, prompt, Sampling(max_tokens=200, grammar=grammar)))
    texts: dict[int, str] = {}
    while tiny.engine.has_work():
        for step in tiny.engine.step():
            texts[step.seq_id] = texts.get(step.seq_id, "") + step.text
    for i, schema in enumerate(schemas):
        jsonschema.validate(json.loads(texts[100 + i]), schema)


@pytest.mark.parametrize(
    "schema",
    [{"type": "nonsense"}, {"type": "object", "properties": {"a": {"$ref": "#/missing"}}}],
)
def test_bad_schemas_are_invalid_requests(schema: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest) as info:
        compile_schema(schema)
    assert info.value.param == "text.format.schema"


def test_oversized_schema_is_rejected() -> None:
    huge = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(5000)}}
    with pytest.raises(InvalidRequest):
        compile_schema(huge)


FORCED_CALL = {
    "type": "object",
    "properties": {
        "name": {"const": "get_weather"},
        "arguments": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("seq_id", [300, 301, 302])
def test_a_forced_call_is_written_in_the_models_own_tags(tiny: LoadedModel, seq_id: int) -> None:
    text = generate(tiny, tiny.codec.compile_call(FORCED_CALL, "hermes"), seq_id, max_tokens=120)
    assert text.startswith("<tool_call>\n")
    assert text.endswith("\n</tool_call>")
    parser = HermesToolParser(frozenset({"get_weather"}))
    events = parser.feed(text) + parser.finish()
    (call,) = [e for e in events if isinstance(e, CallClosed)]
    jsonschema.validate(json.loads(call.arguments), FORCED_CALL["properties"]["arguments"])
    assert parser.text == ""


def test_formats_without_call_tokens_get_a_bare_json_call(tiny: LoadedModel) -> None:
    assert tiny.codec.compile_call(FORCED_CALL, "mistral") == tiny.codec.compile_schema(FORCED_CALL)


# Batch masks: one llguidance call per step for the whole batch, checked against the
# per-sequence processor on the real tokenizer.

MASK_SCHEMAS: list[dict[str, Any] | None] = [
    {
        "type": "object",
        "properties": {"k": {"type": "boolean"}, "n": {"type": "integer"}},
        "required": ["k", "n"],
        "additionalProperties": False,
    },
    None,
    {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
    {"enum": ["red", "green", "blue"]},
    None,
]


@pytest.fixture(scope="module")
def tokenizer() -> llguidance.LLTokenizer:
    import llguidance.hf
    from transformers import AutoTokenizer

    return llguidance.hf.from_tokenizer(AutoTokenizer.from_pretrained(ensure_tiny_model()))


@pytest.fixture(scope="module")
def compiler(tokenizer: llguidance.LLTokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer)


@pytest.fixture(scope="module")
def model_vocab() -> int:
    """The tiny model's logits width: its embedding table is wider than the tokenizer."""
    config = json.loads((ensure_tiny_model() / "config.json").read_text())
    return int(config["vocab_size"])


def per_row(
    processors: list[GrammarProcessor | None], history: list[list[int]], logits: Any
) -> Any:
    import mlx.core as mx

    rows = []
    for b, processor in enumerate(processors):
        row = logits[b : b + 1]
        rows.append(row if processor is None else processor(mx.array(history[b]), row))
    return mx.concatenate(rows, axis=0)


def test_batch_masks_match_the_per_row_processor_along_a_generation(
    compiler: GrammarCompiler, model_vocab: int
) -> None:
    load_fast_blas()
    import mlx.core as mx

    grammars = [None if s is None else compiler.compile_schema(s) for s in MASK_SCHEMAS]
    matchers = [None if g is None else compiler.matcher(g) for g in grammars]
    processors = [None if g is None else compiler.processor(g) for g in grammars]
    history: list[list[int]] = [[0] for _ in grammars]  # the processor skips its first token
    masks = compiler.masks(model_vocab)
    mx.random.seed(7)
    for _ in range(8):
        logits = mx.random.normal((len(grammars), model_vocab))
        masked = masks.apply(logits, matchers)
        assert mx.array_equal(masked, per_row(processors, history, logits)).item()
        allowed = masks.allowed(matchers)
        assert allowed.shape == (len(grammars), model_vocab)
        assert mx.array_equal(allowed, mx.isfinite(masked)).item()
        counts = allowed.sum(axis=1).tolist()
        for b, matcher in enumerate(matchers):
            if matcher is None:
                assert counts[b] == model_vocab
                continue
            assert 0 < counts[b] < model_vocab // 2  # a real constraint, never a dead end
            token = int(mx.argmax(masked[b]).item())
            assert matcher.consume_token(token)
            history[b].append(token)
    assert not any(m is not None and m.is_error() for m in matchers)


def test_tokens_past_the_tokenizer_are_allowed_only_in_free_rows(
    compiler: GrammarCompiler, tokenizer: llguidance.LLTokenizer
) -> None:
    load_fast_blas()

    wide = tokenizer.vocab_size + 77  # not on a 32-token boundary
    grammar = compiler.compile_schema({"type": "string"})
    allowed = compiler.masks(wide).allowed([compiler.matcher(grammar), None])
    assert allowed.shape == (2, wide)
    assert not allowed[0, tokenizer.vocab_size :].any().item()
    assert allowed[0, : tokenizer.vocab_size].any().item()
    assert allowed[1].all().item()


def test_a_matcher_in_error_blocks_nothing(
    compiler: GrammarCompiler, tokenizer: llguidance.LLTokenizer, model_vocab: int
) -> None:
    load_fast_blas()
    import mlx.core as mx

    grammar = compiler.compile_schema({"enum": ["red"]})
    broken, healthy = compiler.matcher(grammar), compiler.matcher(grammar)
    (bad,) = tokenizer.tokenize_str("z")
    assert not broken.consume_token(bad)
    assert broken.is_error()
    masks = compiler.masks(model_vocab)
    allowed = masks.allowed([broken, healthy])
    assert allowed[0].all().item()
    assert not allowed[1].all().item()
    logits = mx.zeros((1, model_vocab))
    assert masks.apply(logits, [broken]) is logits


def test_logits_without_a_constrained_row_come_back_untouched(
    compiler: GrammarCompiler, model_vocab: int
) -> None:
    load_fast_blas()
    import mlx.core as mx

    logits = mx.zeros((3, model_vocab))
    masks = compiler.masks(model_vocab)
    assert masks.apply(logits, [None, None, None]) is logits
    assert masks.allowed([None, None, None]).all().item()
