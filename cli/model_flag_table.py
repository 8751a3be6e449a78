"""The serve flags that say which models the server may load, and how many at once
(part of the flag table, `cli/flag_table.py`)."""

from __future__ import annotations

from pathlib import Path

from mlxcel.cli.flag_kinds import Flag
from mlxcel.config import Settings

_DEFAULTS = Settings()

MODEL_FLAGS: tuple[Flag, ...] = (
    Flag(
        ("-m", "--model"),
        "model",
        str,
        None,
        "LLAMA_ARG_MODEL",
        "local MLX model folder to serve (default: the embedded default model, "
        "Qwen2.5-Coder-0.5B-Instruct, obtained by `mlxcel fetch-model`); NAME=PATH serves "
        "it as NAME, and repeated, several models by name (the first is the default)",
        repeat=True,
    ),
    Flag(
        ("--models-dir",),
        "models_dir",
        Path,
        _DEFAULTS.models_dir,
        "MLXCEL_MODELS_DIR",
        "a folder of MLX model folders: each is a model, named by its folder",
    ),
    Flag(
        ("--max-loaded-models",),
        "max_loaded_models",
        int,
        _DEFAULTS.max_loaded_models,
        "MLXCEL_MAX_LOADED_MODELS",
        "models loaded at once; a request for another unloads the least recently used "
        "unpinned one once its work is done",
    ),
    Flag(
        ("--idle-unload-secs",),
        "idle_unload_secs",
        float,
        _DEFAULTS.idle_unload_secs,
        "MLXCEL_IDLE_UNLOAD_SECS",
        "unload a model no request used for this long (0: never)",
    ),
    Flag(
        ("--pin",),
        "pin",
        str,
        None,
        "MLXCEL_PIN",
        "NAME: a model loaded at start and never unloaded; repeat it for several",
        repeat=True,
    ),
    Flag(
        ("-a", "--alias"),
        "alias",
        str,
        _DEFAULTS.alias,
        "LLAMA_ARG_ALIAS",
        "name clients use in `model` (default: the model folder's name)",
    ),
    Flag(
        ("--model-alias",),
        "model_alias",
        str,
        None,
        "MLXCEL_MODEL_ALIAS",
        "PATTERN=NAME: a request naming a model that matches the glob PATTERN "
        "(`claude-*`) gets NAME, a served model; repeat it or comma-separate several; "
        "without a match an unknown name is a 404",
        repeat=True,
    ),
)
