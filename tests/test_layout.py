"""The layout rules of docs/ARCHITECTURE.md, checked on the source: no import circle in
``pagestats`` or ``collectors`` (lazy imports inside functions included), no module over 500
lines, and one place that opens a DuckDB connection (:func:`pagestats.io.duck.connect`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pagestats", "collectors")


def _modules() -> dict[str, Path]:
    """Every module of the packages, by dotted name (a package by its ``__init__``)."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its body: ``from X import Y`` names the
    module ``X.Y`` when there is one, else ``X``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m in modules and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle():
    modules = _modules()
    assert len(modules) > 100  # the walk found the packages
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert sum(map(len, graph.values())) > 200
    assert _cycles(graph) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_over_500_lines(package):
    lengths = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in (ROOT / package).rglob("*.py")}
    assert lengths and {p: n for p, n in lengths.items() if n > 500} == {}


def test_one_place_opens_a_duckdb_connection():
    sites = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "connect"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "duckdb"):
                sites.append(name)
    assert sites == ["pagestats.io.duck"]


_FLAG = __import__("re").compile(r"(?<![\w-])--(?!no-deps\b)[a-z][a-z0-9-]+")  # pip's --no-deps is pip's


def _flags_in_raises(source: str) -> list[str]:
    """The string constants of ``raise`` statements in ``source`` that name a command-line option."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Raise) and node.exc is not None:
            found += [sub.value for sub in ast.walk(node.exc)
                      if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and _FLAG.search(sub.value)]
    return found


def test_the_flag_finder_finds_a_planted_flag():
    assert _flags_in_raises('def f(n):\n    raise ValueError(f"--rows must be at least 1, got {n}")') \
        == ["--rows must be at least 1, got "]
    assert _flags_in_raises('raise ValueError("rows must be at least 1 (b--a is not a flag)")') == []


def test_library_errors_name_no_command_line_option():
    """The libraries speak their own terms (parameter names); ``pagestats.cli`` and ``collectors.cli``
    word their flags."""
    found = {}
    for name, path in _modules().items():
        if name.startswith("pagestats.cli") or name == "collectors.cli":
            continue
        flags = _flags_in_raises(path.read_text())
        if flags:
            found[name] = flags
    assert found == {}
