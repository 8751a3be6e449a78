"""`ModelNames`: which `model` a request may send for the loaded model."""

from __future__ import annotations

import pytest

from mlxcel.generation import ModelNames

NAMES = ModelNames("qwen2.5-coder-0.5b-instruct", "/models/qwen-f32")


def test_the_alias_the_path_and_the_folder_name_match_in_any_case() -> None:
    for name in ("qwen2.5-coder-0.5b-instruct", "QWEN2.5-Coder-0.5B-Instruct", "qwen-f32"):
        assert NAMES.matches(name)
    assert NAMES.matches("/models/qwen-f32/")
    assert not NAMES.matches("qwen2.5-coder")
    assert not NAMES.matches("claude-sonnet-4-5")


def test_aliases_add_glob_patterns_matched_without_case() -> None:
    aliased = NAMES.aliased([("claude-*", "qwen2.5-coder-0.5b-instruct"), ("gpt-?", "qwen-f32")])
    assert aliased.patterns == ("claude-*", "gpt-?")
    for name in ("claude-sonnet-4-5", "Claude-Haiku-4-5", "gpt-5", "qwen-f32"):
        assert aliased.matches(name)
    for name in ("gpt-55", "sonnet", "my-claude-x", ""):
        assert not aliased.matches(name)
    assert aliased.listed() == ["qwen2.5-coder-0.5b-instruct", "claude-*", "gpt-?"]


def test_adding_the_same_aliases_again_changes_nothing() -> None:
    once = NAMES.aliased([("claude-*", "qwen-f32")])
    assert once.aliased([("claude-*", "qwen-f32")]) == once
    assert NAMES.aliased([]) == NAMES


def test_an_alias_must_name_the_served_model() -> None:
    with pytest.raises(ValueError, match="'llama-3' is not the served model"):
        NAMES.aliased([("claude-*", "llama-3")])
