"""The runtime's communication layer imports downward only (lazy imports included):
runtime.comm.* below runtime.watchdog / runtime.flight, those below the interpreter, the
interpreter below runtime.session and runtime.graph."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Lower layers first; a module may import only from its own layer or the ones before it.
LAYERS = [
    {"runtime.comm.base", "runtime.bootstrap", "runtime.comm"},
    {"runtime.flight"},
    {"runtime.watchdog"},
    {"runtime.comm.mpi", "runtime.comm.torch_pg", "runtime.comm.nccl",
     "runtime.comm.copy_engine", "runtime.fault_injection"},
    {"runtime.interpreter"},
    {"runtime.session", "runtime.graph"},
]
LAYER = {m: i for i, layer in enumerate(LAYERS) for m in layer}


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every runtime module ``path`` imports, at the top or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}  # from runtime import flight
    return {m for m in out if m in LAYER}


def test_the_communication_layers_import_downward_only():
    upward = []
    for m in LAYER:
        rel = Path(*m.split("."))
        path = ROOT / (rel / "__init__.py" if (ROOT / rel).is_dir() else rel.with_suffix(".py"))
        for dep in imports(path):
            if dep != m and LAYER[dep] > LAYER[m]:
                upward.append(f"{m} imports {dep}")
    # runtime.comm.base picks a backend by name: it may name the backends it makes.
    allowed = {f"runtime.comm.base imports runtime.comm.{b}"
               for b in ("mpi", "nccl", "torch_pg", "copy_engine")}
    assert sorted(set(upward) - allowed) == []


def test_no_backend_imports_the_module_that_picks_it():
    for path in [ROOT / "runtime" / "comm" / f"{b}.py"
                 for b in ("mpi", "nccl", "torch_pg", "copy_engine")] + [ROOT / "runtime" / "bootstrap.py"]:
        assert "runtime.comm.base" not in imports(path), path.name


def test_symmetric_memory_is_set_up_without_the_deprecated_call():
    # torch 2.11 deprecated enable_symm_mem_for_group (rendezvous finds the group's store
    # by name); calling it warns on every run.
    callers = [str(p.relative_to(ROOT)) for d in ("runtime", "hostir", "lowering")
               for p in (ROOT / d).rglob("*.py")
               if "enable_symm_mem_for_group(" in p.read_text()]
    assert callers == []
