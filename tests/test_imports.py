"""The direction of the package's imports, read from the source: the rules that keep the
layers apart stay true because this test walks the whole import graph.

    cli/       the command line: flags, serving the real model, codex-config
    http/      the wire: routes, schemas, JSON objects, SSE, errors, the server
    prepare/   from a request's parameters to a GenerationRequest
    fleet/     several models: the registry, each loaded model's engines, a request's lease
    actors/    the running tasks (scheduler, slots, jobs) and their message catalogue
    respond/   generated text to items, stream events and the final record
    store/     what the server keeps, where, and for how long
    model/     the engine, the model thread, prompts; native/: the CPU acceleration
    generation.py, items.py, errors.py   the vocabulary every layer speaks
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("actors", "cli", "fleet", "http", "model", "prepare", "respond", "store")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("mlxcel", *parts))


def package_files() -> Iterator[Path]:
    yield from (p for p in ROOT.glob("*.py"))
    for top in SOURCES:
        yield from (ROOT / top).rglob("*.py")


def import_graph() -> dict[str, set[str]]:
    """Each mlxcel module and the mlxcel modules it imports (anywhere in the file)."""
    files = {module_name(path): path for path in package_files()}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets.add(node.module)
                # `from mlxcel.pkg import module` imports the module too.
                targets.update(f"{node.module}.{alias.name}" for alias in node.names)
        graph[name] = {t for t in targets if t in files}
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> dict[str, list[str]]:
    """Every module `start` imports directly or through others, with one path to it."""
    paths = {start: [start]}
    pending = [start]
    while pending:
        current = pending.pop()
        for target in sorted(graph[current]):
            if target not in paths:
                paths[target] = [*paths[current], target]
                pending.append(target)
    del paths[start]
    return paths


GRAPH = import_graph()


def under(prefix: str) -> list[str]:
    return sorted(m for m in GRAPH if m == prefix or m.startswith(f"{prefix}."))


def test_the_graph_sees_every_layer() -> None:
    assert "mlxcel.http.routes" in GRAPH
    assert "mlxcel.model.actor" in GRAPH["mlxcel.actors.scheduler"]
    assert reachable(GRAPH, "mlxcel.app")  # the wiring reaches everything


@pytest.mark.parametrize("module", under("mlxcel.http"))
def test_http_talks_to_the_model_only_through_the_actors(module: str) -> None:
    direct = sorted(t for t in GRAPH[module] if t.startswith("mlxcel.model"))
    assert not direct, f"{module} imports {direct}"


@pytest.mark.parametrize(
    "module", [*under("mlxcel.model"), "mlxcel.actors.messages", *under("mlxcel.respond")]
)
def test_the_model_and_the_catalogue_never_reach_http(module: str) -> None:
    found = {t: p for t, p in reachable(GRAPH, module).items() if t.startswith("mlxcel.http")}
    assert not found, " -> ".join(next(iter(found.values())))


@pytest.mark.parametrize("module", under("mlxcel.actors"))
def test_the_actors_never_reach_the_fleet_above_them(module: str) -> None:
    found = {t: p for t, p in reachable(GRAPH, module).items() if t.startswith("mlxcel.fleet")}
    assert not found, " -> ".join(next(iter(found.values())))


def test_no_import_circles() -> None:
    """No module reaches itself: every room's imports run one way."""
    circles = sorted(
        f"{m} -> " + " -> ".join(reachable(GRAPH, t).get(m, [t]))
        for m in GRAPH
        for t in GRAPH[m]
        if t == m or m in reachable(GRAPH, t)
    )
    assert not circles, "\n".join(circles)


@pytest.mark.parametrize("module", under("mlxcel.prepare"))
def test_preparation_reaches_the_model_only_through_what_it_is_handed(module: str) -> None:
    direct = sorted(t for t in GRAPH[module] if t.startswith("mlxcel.model"))
    assert not direct, f"{module} imports {direct}"


@pytest.mark.parametrize("module", under("mlxcel.prepare"))
def test_preparation_knows_no_wire_format(module: str) -> None:
    found = {t: p for t, p in reachable(GRAPH, module).items() if t.startswith("mlxcel.http")}
    assert not found, " -> ".join(next(iter(found.values())))


VOCABULARY = {"mlxcel.items", "mlxcel.errors", "mlxcel.generation"}


@pytest.mark.parametrize("module", under("mlxcel.store"))
def test_the_store_reaches_nothing_above_it(module: str) -> None:
    above = ("model", "respond", "actors", "fleet", "http", "prepare", "cli", "app", "quotas")
    found = {
        t: p
        for t, p in reachable(GRAPH, module).items()
        if any(t == f"mlxcel.{name}" or t.startswith(f"mlxcel.{name}.") for name in above)
    }
    assert not found, " -> ".join(next(iter(found.values())))


@pytest.mark.parametrize("module", under("mlxcel.respond"))
def test_respond_speaks_only_the_vocabulary(module: str) -> None:
    found = {
        t: p
        for t, p in reachable(GRAPH, module).items()
        if t not in VOCABULARY and not t.startswith("mlxcel.respond")
    }
    assert not found, " -> ".join(next(iter(found.values())))


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_only_the_entry_point_imports_the_command_line(module: str) -> None:
    if module in ("mlxcel.__main__", "mlxcel.cli") or module.startswith("mlxcel.cli."):
        return
    direct = sorted(t for t in GRAPH[module] if t == "mlxcel.cli" or t.startswith("mlxcel.cli."))
    assert not direct, f"{module} imports {direct}"


@pytest.mark.parametrize("module", ["mlxcel.items", "mlxcel.errors", "mlxcel.generation"])
def test_the_vocabulary_stands_on_nothing_but_itself(module: str) -> None:
    assert set(reachable(GRAPH, module)) <= VOCABULARY
