"""The package's layers, kept honest: the runtime never imports the test bed, a lower layer
never imports a higher one, and no two modules import each other (directly or in a circle).

Read from the source (every import statement, also those inside functions), so nothing is
imported and the test runs in well under a second.
"""

from __future__ import annotations

import ast
import os

import pytest

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The runtime, and the test bed: a package of its own (testbed/pyproject.toml).
PACKAGES = {"r2cc_serve": os.path.join(CHECKOUT, "r2cc_serve"),
            "r2cc_testbed": os.path.join(CHECKOUT, "testbed", "r2cc_testbed")}

# Lowest first. A module's layer is that of the longest prefix listed here.
LAYERS = [
    ("r2cc_serve.errors", "r2cc_serve.envs", "r2cc_serve.pins", "r2cc_serve.util", "r2cc_serve._C"),
    ("r2cc_serve.sched", "r2cc_serve.health"),
    ("r2cc_serve.comm",),
    # control/ attaches the rail monitor (health/) and its agent to a communicator (control.attach):
    # above comm/, which moves tensors and imports neither.
    ("r2cc_serve.control",),
    ("r2cc_serve.admin", "r2cc_serve.doctor"),
    ("r2cc_serve.vllm",),
    ("r2cc_testbed", "r2cc_testbed.faults.model", "r2cc_testbed.faults.timing"),
    ("r2cc_testbed.faults", "r2cc_testbed.lab", "r2cc_testbed.doctor_lab", "r2cc_testbed.guest"),
    ("r2cc_testbed.model",),
    ("r2cc_testbed.bench", "r2cc_testbed.serving"),
    ("r2cc_testbed.loadtest", "r2cc_testbed.observe"),
    ("r2cc_serve.cli", "r2cc_serve.knobs_cli"),
]
RUNTIME_TOP = 5  # layers 0..5 ship to a serving fleet; the test bed starts above
# The command line sits on top and finds the test bed's subcommands by name, only if installed.


def _modules() -> dict[str, str]:
    out = {}
    for root in PACKAGES.values():
        for folder, _, files in os.walk(root):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(folder, f)
                    rel = os.path.relpath(path, os.path.dirname(root))[:-3].replace(os.sep, ".")
                    out[rel.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _imports(path: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(tuple(PACKAGES)):
            for alias in node.names:  # `from pkg import module` imports pkg.module
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(tuple(PACKAGES)))
    return found - set(PACKAGES)


def layer(module: str) -> int:
    best, rank = -1, None
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, rank = len(name), i
    if rank is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")
    return rank


GRAPH = {m: _imports(p) for m, p in MODULES.items() if m not in PACKAGES}


def test_every_module_has_a_layer():
    for m in GRAPH:
        layer(m)


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_import_from_a_lower_layer_to_a_higher_one(module):
    mine = layer(module)
    up = sorted(t for t in GRAPH[module] if layer(t) > mine)
    assert not up, f"{module} (layer {mine}) imports {up} from higher layers"


def test_the_runtime_never_imports_the_test_bed():
    runtime = [m for m in GRAPH if m.startswith("r2cc_serve.")]
    assert runtime and all(layer(m) <= RUNTIME_TOP or m in ("r2cc_serve.cli", "r2cc_serve.knobs_cli") for m in runtime)
    bad = sorted((m, t) for m in runtime for t in GRAPH[m] if t.startswith("r2cc_testbed"))
    assert not bad, f"the runtime package imports the test bed (which a serving host may not have): {bad}"


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
