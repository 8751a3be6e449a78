"""The flags that name several models: `--model NAME=PATH` beside a bare `--model`,
`--models-dir`, `--max-loaded-models`, `--idle-unload-secs` and `--pin`, and the models
the command line resolves from them (before anything loads)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlxcel.app import configured_models
from mlxcel.cli.flags import build_parser, settings_from_args
from mlxcel.cli.serve import resolve_models
from mlxcel.config import Settings
from mlxcel.errors import ConfigError
from mlxcel.fleet import ConfiguredModel
from mlxcel.generation import ModelNames
from mlxcel.model.fake import fake_factory


def settings(argv: list[str], env: dict[str, str] | None = None) -> Settings:
    return settings_from_args(build_parser("mlxcel-server", env or {}).parse_args(argv))


def folder(root: Path, name: str) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    return path


def test_named_models_beside_a_bare_one(tmp_path: Path) -> None:
    a, b = folder(tmp_path, "one"), folder(tmp_path, "two")
    given = settings(["-m", str(a), "--model", f"small={b}", "--pin", "small"])
    assert given.model == a
    assert given.named_models == (("small", b),)
    assert given.pinned_models == ("small",)
    found = resolve_models(given)
    assert [(n.alias, p) for p, n in found] == [("one", a.resolve()), ("small", b.resolve())]
    with pytest.raises(ConfigError, match="NAME=PATH"):
        settings(["-m", str(a), "-m", str(b)])  # a second model needs a name


def test_the_first_named_model_is_the_default_and_a_dir_adds_its_folders(tmp_path: Path) -> None:
    b = folder(tmp_path, "b")
    folder(tmp_path / "many", "x")
    folder(tmp_path / "many", "y")
    (tmp_path / "many" / "notes").mkdir()  # no config.json: not a model
    given = settings(["--model", f"main={b}", "--models-dir", str(tmp_path / "many")])
    assert given.model is None
    assert [n.alias for _, n in resolve_models(given)] == ["main", "x", "y"]
    given = settings(["--model", f"x={b}", "--models-dir", str(tmp_path / "many")])
    with pytest.raises(ConfigError, match="named 'x'"):
        resolve_models(given)
    with pytest.raises(ConfigError, match="no MLX model folder"):
        resolve_models(settings(["--models-dir", str(tmp_path / "many" / "notes")]))
    with pytest.raises(ConfigError, match=r"no config\.json"):
        resolve_models(settings(["--model", f"n={tmp_path / 'many'}"]))


def test_limits_from_flags_or_environment() -> None:
    assert (Settings().max_loaded_models, Settings().idle_unload_secs) == (1, 0.0)
    env = {"MLXCEL_MAX_LOADED_MODELS": "3", "MLXCEL_IDLE_UNLOAD_SECS": "90"}
    given = settings([], env)
    assert (given.max_loaded_models, given.idle_unload_secs) == (3, 90.0)
    with pytest.raises(ConfigError, match="--max-loaded-models"):
        settings(["--max-loaded-models", "0"])
    with pytest.raises(ConfigError, match="--idle-unload-secs"):
        settings(["--idle-unload-secs", "-1"])


def test_aliases_and_pins_must_name_a_served_model() -> None:
    models = [
        ConfiguredModel(ModelNames("coder", "/m/coder"), fake_factory),
        ConfiguredModel(ModelNames("small", "/m/small"), fake_factory),
    ]
    aliased = Settings(model_aliases=(("claude-*-haiku*", "small"),), pinned_models=("coder",))
    coder, small = configured_models(aliased, models)
    assert small.names.matches("claude-3-5-haiku-latest")
    assert not coder.names.matches("claude-3-5-haiku-latest")
    assert (coder.pinned, small.pinned) == (True, False)
    with pytest.raises(ConfigError, match="--model-alias"):
        configured_models(Settings(model_aliases=(("x", "big"),)), models)
    with pytest.raises(ConfigError, match="--pin big"):
        configured_models(Settings(pinned_models=("big",)), models)
