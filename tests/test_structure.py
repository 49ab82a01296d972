"""The package's shape: the one-way flow between stages, and files that fit on a few screens.

Checked on the source text (ast), so a violation fails here before it becomes a habit.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "opdiff"
MAX_LINES = 500

# What each part may not import (top-level parts of the package).
FORBIDDEN = {
    "store": {"capture", "comparison", "report", "overflow", "onnx", "api", "demo", "commands",
              "compat", "monitor", "trend"},
    "capture": {"comparison", "report", "api", "commands"},
    "comparison": {"report", "capture", "api", "commands", "demo"},
    "report": {"capture", "api", "commands", "demo"},
    "overflow": {"report", "api", "commands", "demo"},
    # below every stage
    "ops": {"store", "capture", "comparison", "report", "overflow", "onnx", "api"},
    "dtypes": {"store", "capture", "comparison", "report", "overflow", "onnx", "api"},
    "numbers": {"store", "capture", "comparison", "report", "overflow", "onnx", "api"},
    "errors": {"store", "capture", "comparison", "report", "overflow", "onnx", "api"},
    "config": {"capture", "comparison", "report", "overflow", "onnx", "api"},
    "environment": {"capture", "comparison", "report", "overflow", "onnx", "api"},
}


def _sources():
    return sorted(SRC.rglob("*.py"))


def _part(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0][:-3] if len(rel.parts) == 1 else rel.parts[0]


def _imported_parts(path: Path) -> set[str]:
    """Top-level opdiff parts a module imports (absolute `opdiff.x` or relative `..x`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = path.relative_to(SRC).parent.parts
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "opdiff" and len(parts) > 1:
                    out.add(parts[1])
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                if parts[0] == "opdiff":
                    out.update([parts[1]] if len(parts) > 1 else [a.name for a in node.names])
            else:
                base = list(package[:len(package) - (node.level - 1)]) if node.level > 1 else list(package)
                target = base + ((node.module or "").split(".") if node.module else [])
                if target:
                    out.add(target[0])
                else:
                    out.update(a.name for a in node.names)
    return out


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(SRC)))
def test_file_fits_on_a_few_screens(path):
    n = len(path.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(SRC)} has {n} lines (> {MAX_LINES}): two ideas?"


def test_the_stages_import_one_way():
    bad = []
    for path in _sources():
        part = _part(path)
        for imported in _imported_parts(path) & FORBIDDEN.get(part, set()):
            bad.append(f"{path.relative_to(SRC)} imports {imported}")
    assert not bad, "\n".join(bad)


def test_no_import_cycle_between_parts():
    graph: dict[str, set[str]] = {}
    for path in _sources():
        part = _part(path)
        graph.setdefault(part, set()).update(p for p in _imported_parts(path) if p != part)
    # api (the facade), cli and commands wire everything together; they sit above the stages.
    top = {"api", "cli", "commands", "__init__", "__main__"}
    graph = {k: {v for v in vs if v not in top} for k, vs in graph.items() if k not in top}
    seen, stack, cycles = set(), [], []

    def visit(node):
        if node in stack:
            cycles.append(" -> ".join(stack[stack.index(node):] + [node]))
            return
        if node in seen:
            return
        seen.add(node)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            visit(nxt)
        stack.pop()

    for node in sorted(graph):
        visit(node)
    assert not cycles, "import cycles between parts:\n" + "\n".join(cycles)
