"""The module graph of hostir, lowering and runtime is a DAG whose arrows point down.

Layers, bottom to top (docs/ARCHITECTURE.md says why):

    IR        hostir.errors, hostir.options, hostir.ir, hostir.printer, hostir.parser,
              hostir.verify (and the empty package ``hostir`` itself)
    lowering  lowering.*
    runtime   runtime.*   (reads the kernel specs of lowering.kernels and the IR)
    top       every other hostir.* module: hostir.run, hostir.jobs.*, hostir.nn, ...

A module may import its own layer or any layer below, never one above, and no chain of
imports may come back to where it started. Every import counts: module level, inside a
function (the lazy ones that hide cycles), ``from pkg import name`` where ``name`` is a
submodule, and relative imports. The test lists every violation at once.

The same rules are written as import-linter contracts in pyproject.toml; when
``lint-imports`` is installed the last test runs it too.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("hostir", "lowering", "runtime")
IR_LAYER = frozenset({"hostir", "hostir.errors", "hostir.options", "hostir.ir",
                      "hostir.printer", "hostir.parser", "hostir.verify"})
LAYER_NAMES = ("IR", "lowering", "runtime", "top")


def layer_of(module: str) -> int:
    """0 for the IR layer, 1 lowering, 2 runtime, 3 the user-facing top."""
    if module in IR_LAYER:
        return 0
    top = module.split(".")[0]
    if top == "lowering":
        return 1
    if top == "runtime":
        return 2
    return 3


def project_modules(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Module name -> file, for every .py under the packages (``__init__`` names the package)."""
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _resolve(name: str, modules) -> str | None:
    """The longest prefix of ``name`` that is a project module (``import a.b.c`` where c is a
    function's module, say), or None for an outside module."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def imports_of(module: str, path: Path, modules) -> set[str]:
    """Project modules that ``module`` imports anywhere in its file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):  # walks function bodies too: lazy imports count
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name, modules)
                if target:
                    found.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            for alias in node.names:
                # `from pkg import sub` imports the submodule pkg.sub when there is one
                full = f"{stem}.{alias.name}"
                target = full if full in modules else _resolve(stem, modules)
                if target:
                    found.add(target)
    found.discard(module)
    return found


def module_graph(root: Path = ROOT, packages=PACKAGES) -> dict[str, set[str]]:
    modules = project_modules(root, packages)
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest cycle through each strongly connected component of more than one module
    (Tarjan's algorithm, iterative so a deep graph cannot hit the recursion limit)."""
    index, low, on_stack, stack, sccs = {}, {}, set(), [], []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    scc = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        scc.append(m)
                        if m == node:
                            break
                    if len(scc) > 1:
                        sccs.append(set(scc))
    out = []
    for scc in sccs:
        first = min(scc)
        # breadth-first from `first` back to itself inside the component: a shortest cycle
        previous, frontier, found = {first: None}, [first], None
        while frontier and found is None:
            nxt = []
            for node in frontier:
                for child in sorted(graph[node] & scc):
                    if child == first:
                        found = node
                        break
                    if child not in previous:
                        previous[child] = node
                        nxt.append(child)
                if found is not None:
                    break
            frontier = nxt
        path, node = [], found
        while node is not None:
            path.append(node)
            node = previous[node]
        out.append(path[::-1] + [first])
    return sorted(out)


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if layer_of(a) < layer_of(b))


def violations(graph) -> list[str]:
    out = [f"cycle: {' -> '.join(c)}" for c in cycles(graph)]
    out += [f"upward import: {a} ({LAYER_NAMES[layer_of(a)]}) imports {b} "
            f"({LAYER_NAMES[layer_of(b)]})" for a, b in upward_imports(graph)]
    return out


# --------------------------------------------------------------------------- the project


def test_the_module_graph_is_a_dag_whose_arrows_point_down():
    graph = module_graph()
    assert "hostir.ir" in graph and "runtime.interpreter" in graph and "lowering.pipeline" in graph
    found = violations(graph)
    assert not found, "\n" + "\n".join(found)


def test_import_linter_contracts_hold():
    exe = shutil.which("lint-imports")
    if exe is None:
        pytest.skip("import-linter is not installed")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([exe, "--no-cache", str(ROOT / "pyproject.toml")], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


# --------------------------------------------------------------------------- the checker itself


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def test_the_checker_sees_lazy_relative_and_submodule_imports(tmp_path):
    root = _tree(tmp_path, {
        "hostir/__init__.py": "",
        "hostir/ir.py": "def f():\n    from hostir.printer import print_program\n",
        "hostir/printer.py": "from . import ir\n",
        "hostir/run.py": "import runtime.session\n",
        "runtime/__init__.py": "",
        "runtime/session.py": "from .comm.base import Backend\n",
        "runtime/comm/__init__.py": "",
        "runtime/comm/base.py": "from .. import session\nimport os\n",
        "lowering/__init__.py": "",
        "lowering/pipeline.py": "import torch\n\ndef g():\n    import runtime.session.nothing\n",
    })
    graph = module_graph(root)
    assert graph["hostir.ir"] == {"hostir.printer"}        # lazy, inside a function
    assert graph["hostir.printer"] == {"hostir.ir"}        # relative, a submodule by name
    assert graph["runtime.session"] == {"runtime.comm.base"}
    assert graph["runtime.comm.base"] == {"runtime.session"}
    assert graph["lowering.pipeline"] == {"runtime.session"}
    found = violations(graph)
    assert found == [
        "cycle: hostir.ir -> hostir.printer -> hostir.ir",
        "cycle: runtime.comm.base -> runtime.session -> runtime.comm.base",
        "upward import: lowering.pipeline (lowering) imports runtime.session (runtime)",
    ]


def test_the_checker_passes_a_clean_tree(tmp_path):
    root = _tree(tmp_path, {
        "hostir/__init__.py": "", "hostir/ir.py": "from hostir.errors import X\n",
        "hostir/errors.py": "", "hostir/nn.py": "from runtime import session\n",
        "lowering/__init__.py": "", "lowering/pipeline.py": "from hostir import ir\n",
        "runtime/__init__.py": "", "runtime/session.py": "import lowering.pipeline\n",
    })
    graph = module_graph(root)
    assert graph["runtime.session"] == {"lowering.pipeline"}
    assert violations(graph) == []


def test_layers_are_assigned_as_documented():
    assert [layer_of(m) for m in ("hostir.verify", "lowering.kernels.matmul",
                                  "runtime.interpreter", "hostir.jobs.matmul", "hostir.nn")] \
        == [0, 1, 2, 3, 3]


if __name__ == "__main__":  # `python tests/unit/test_imports.py` prints the violations
    found = violations(module_graph())
    print("\n".join(found) or "the module graph is a DAG whose arrows point down")
    sys.exit(1 if found else 0)
