"""The repository root is the `mlxcel` package; its `http/` must not shadow the stdlib."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_stdlib_http_is_not_shadowed_from_the_repository_root() -> None:
    code = "import http, http.client, hypercorn, httpx; print(http.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert Path(out.stdout.strip()).parent.parent != ROOT
    assert "site-packages" not in out.stdout  # the standard library's, not a package's


def test_mlxcel_http_still_imports_as_a_namespace_portion() -> None:
    code = "import mlxcel.http.routes as r, http; assert r.__name__ == 'mlxcel.http.routes'"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_no_init_files_that_could_shadow() -> None:
    assert not (ROOT / "http" / "__init__.py").exists()
    assert not list((ROOT / "tests").rglob("__init__.py"))


def test_every_source_folder_is_an_installed_package() -> None:
    """A folder of modules left out of pyproject's list is missing from a real install."""
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    folders = {
        path.parent.relative_to(ROOT)
        for top in ("actors", "cli", "http", "model", "prepare", "respond", "store")
        for path in (ROOT / top).rglob("*.py")
    }
    assert {".".join(("mlxcel", *folder.parts)) for folder in folders} <= listed


def test_settings_load_no_layer() -> None:
    """Settings are plain values: reading them pulls in no actor, model or HTTP code."""
    code = "import json, sys, mlxcel.config; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    loaded = {name for name in json.loads(out.stdout) if name.startswith("mlxcel.")}
    assert loaded == {"mlxcel.store", "mlxcel.store.limits", "mlxcel.config", "mlxcel.errors"}


MODULE_LINES = 400
TEST_MODULE_LINES = 450
FUNCTION_LINES = 60


def _tracked_python() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first statement after the docstring to the last one."""
    body = node.body[1:] if ast.get_docstring(node) is not None else node.body
    if not body:
        return 0
    return (body[-1].end_lineno or body[-1].lineno) - body[0].lineno + 1


def test_modules_and_functions_stay_small() -> None:
    """A module over 400 lines (450 for tests) or a function body over 60 is split by role."""
    offenders = []
    for name in _tracked_python():
        source = (ROOT / name).read_text()
        lines = len(source.splitlines())
        is_test = name.startswith("tests/")
        limit = TEST_MODULE_LINES if is_test else MODULE_LINES
        if lines > limit:
            offenders.append(f"{name}: {lines} lines (limit {limit})")
        if is_test:
            continue
        for node in ast.walk(ast.parse(source, filename=name)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                size = _body_lines(node)
                if size > FUNCTION_LINES:
                    offenders.append(f"{name}:{node.lineno} {node.name}: body of {size} lines")
    assert not offenders, "split these by role:\n" + "\n".join(offenders)


ACTORS_MODULES = 8


def test_actors_holds_only_the_running_tasks() -> None:
    """`actors/` keeps the tasks and their catalogue; a concern that grows beside them
    (several models, say) gets a room of its own."""
    modules = sorted(p.name for p in (ROOT / "actors").glob("*.py") if p.name != "__init__.py")
    assert len(modules) <= ACTORS_MODULES, modules
