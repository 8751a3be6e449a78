"""The store's front door, `mlxcel.store`: the names the rest of the package uses, each
the very object its module defines, loaded only when asked for."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import mlxcel.store

ROOT = Path(__file__).resolve().parents[2]


def test_each_name_is_the_one_its_module_defines() -> None:
    for name, module in mlxcel.store.FRONT_DOOR.items():
        defined = getattr(importlib.import_module(f"mlxcel.store.{module}"), name)
        assert getattr(mlxcel.store, name) is defined, name


def test_the_names_the_type_checker_sees_are_the_names_served() -> None:
    """The typed imports and the table of names are two lists: they must not drift."""
    tree = ast.parse((ROOT / "store" / "__init__.py").read_text())
    typed = {
        alias.asname or alias.name: node.module.removeprefix("mlxcel.store.")
        for guard in tree.body
        if isinstance(guard, ast.If)
        and isinstance(guard.test, ast.Name)
        and guard.test.id == "TYPE_CHECKING"
        for node in guard.body
        if isinstance(node, ast.ImportFrom) and node.module is not None
        for alias in node.names
    }
    assert typed == mlxcel.store.FRONT_DOOR


def test_a_name_not_at_the_front_door_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = mlxcel.store.no_such_name


def test_importing_the_store_loads_none_of_its_modules() -> None:
    code = "import json, sys, mlxcel.store; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    loaded = {name for name in json.loads(out.stdout) if name.startswith("mlxcel")}
    assert loaded == {"mlxcel", "mlxcel.store"}
