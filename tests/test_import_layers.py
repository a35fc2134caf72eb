"""The package's layers, kept honest: the runtime never imports the test bed, a lower layer
never imports a higher one, and no two modules import each other (directly or in a circle).

Read from the source (every import statement, also those inside functions), so nothing is
imported and the test runs in well under a second.
"""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "r2cc_serve")

# Lowest first. A module's layer is that of the longest prefix listed here.
LAYERS = [
    ("r2cc_serve.errors", "r2cc_serve.envs", "r2cc_serve.pins", "r2cc_serve.util", "r2cc_serve._C"),
    ("r2cc_serve.sched", "r2cc_serve.health"),
    ("r2cc_serve.control",),
    ("r2cc_serve.comm",),
    ("r2cc_serve.admin", "r2cc_serve.doctor"),
    ("r2cc_serve.vllm",),
    # doctor.lab is `r2cc doctor --lab`: a test bed tool that lives beside the doctor
    ("r2cc_serve.testbed", "r2cc_serve.testbed.faults", "r2cc_serve.testbed.lab", "r2cc_serve.doctor.lab"),
    ("r2cc_serve.testbed.model",),
    ("r2cc_serve.testbed.bench", "r2cc_serve.testbed.serving"),
    ("r2cc_serve.testbed.loadtest", "r2cc_serve.testbed.observe"),
    ("r2cc_serve.cli", "r2cc_serve.knobs_cli"),
]
RUNTIME_TOP = 5  # layers 0..5 ship to a serving fleet; the test bed starts above


def _modules() -> dict[str, str]:
    out = {}
    for folder, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _imports(path: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("r2cc_serve"):
            for alias in node.names:  # `from pkg import module` imports pkg.module
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("r2cc_serve"))
    return found - {"r2cc_serve"}


def layer(module: str) -> int:
    best, rank = -1, None
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, rank = len(name), i
    if rank is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")
    return rank


GRAPH = {m: _imports(p) for m, p in MODULES.items() if m != "r2cc_serve"}


def test_every_module_has_a_layer():
    for m in GRAPH:
        layer(m)


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_import_from_a_lower_layer_to_a_higher_one(module):
    mine = layer(module)
    up = sorted(t for t in GRAPH[module] if layer(t) > mine)
    assert not up, f"{module} (layer {mine}) imports {up} from higher layers"


def test_the_runtime_never_imports_the_test_bed():
    runtime = [m for m in GRAPH if layer(m) <= RUNTIME_TOP]
    assert runtime and all(not t.startswith("r2cc_serve.testbed") for m in runtime for t in GRAPH[m])


def test_no_circles():
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(GRAPH.get(m, ())):
            if state.get(t) == "open":
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(t):] + [t]))
            if t in GRAPH and t not in state:
                visit(t)
        stack.pop()
        state[m] = "done"

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)
