"""The package's import graph: no cycle, nothing imports upward (`meshscope.LAYERS`)."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import meshscope

SRC = Path(meshscope.__file__).parent


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Absolute meshscope modules `path` imports (function-local imports included)."""
    module, out = _module(path), set()
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            out |= {target} if node.module or not node.level else {f"{target}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m.split(".")[0] == "meshscope"}


def _graph() -> dict[str, set[str]]:
    return {_module(p): _imports(p) for p in SRC.rglob("*.py")}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None
    return next((i for i, names in enumerate(meshscope.LAYERS) if parts[1] in names), None)


def test_every_subpackage_has_a_layer():
    subpackages = {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}
    assert subpackages == {name for layer in meshscope.LAYERS for name in layer}


def _upward(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, deps in graph.items():
        mine = _layer(module)
        if mine is None:
            continue
        for dep in deps:
            theirs = _layer(dep)
            same_package = dep.split(".")[:2] == module.split(".")[:2]
            if theirs is not None and not same_package and theirs >= mine:
                bad.append(f"{module} (layer {mine + 1}) imports {dep} (layer {theirs + 1})")
    return bad


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of `graph` as a path, or []."""
    known = set(graph)

    def resolve(dep: str) -> str | None:
        while dep and dep not in known:
            dep = dep.rpartition(".")[0]
        return dep or None

    edges = {m: sorted({r for d in deps if (r := resolve(d)) and r != m}) for m, deps in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in edges[node]:
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return []

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return []


def test_nothing_imports_upward_or_sideways():
    bad = _upward(_graph())
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    cycle = _cycle(_graph())
    assert not cycle, " -> ".join(cycle)


def test_the_checks_see_what_they_must():
    """Neither check is vacuous: an upward import, a sideways one and a cycle are each caught."""
    graph = {"meshscope.core.mesh": {"meshscope.report.terminal"}, "meshscope.report.terminal": set(),
             "meshscope.verify.result": {"meshscope.timing.kernels"}, "meshscope.timing.kernels": set()}
    report = next(i for i, names in enumerate(meshscope.LAYERS) if "report" in names) + 1
    assert _upward(graph) == [f"meshscope.core.mesh (layer 1) imports meshscope.report.terminal (layer {report})",
                              "meshscope.verify.result (layer 6) imports meshscope.timing.kernels (layer 6)"]
    ring = {"meshscope.a.x": {"meshscope.a.y"}, "meshscope.a.y": {"meshscope.a.z"}, "meshscope.a.z": {"meshscope.a.x"}}
    assert _cycle(ring) == ["meshscope.a.x", "meshscope.a.y", "meshscope.a.z", "meshscope.a.x"]
    assert _cycle({"meshscope.a.x": {"meshscope.a.y"}, "meshscope.a.y": set()}) == []


def test_the_command_line_and_the_trace_launcher_import_no_numerics():
    """The launcher of a fake world lives through all of it beside the ranks, and its resident memory is
    counted in the fake world's memory target (docs/trace.md, "Frameworks"): numpy (about 15 MiB) or torch
    there would come from a top-level import the command line does not need (the placement advisor's
    solver, once; its link defaults now live in `place.links`)."""
    code = ("import sys, meshscope.cli.parser, meshscope.trace.launch; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'torch', 'matplotlib', 'pandas'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(SRC.parent)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
