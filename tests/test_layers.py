"""The layers import only downward, as docs/architecture.md draws them: every module's imports, read with `ast`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOT = "power"  # power.modes, power.findings, power.codes: below every layer

# layer -> the layers its modules may import (itself included).
ALLOWED = {
    ROOT: {ROOT},
    "power.artifacts": {ROOT, "power.artifacts"},
    "power.kernels": {"power.kernels"},
    "power.orchestrator": {ROOT, "power.artifacts", "power.orchestrator"},
    "power.runtime": {ROOT, "power.artifacts", "power.kernels", "power.runtime"},
}
# The one orchestrator module the runtime reads: the plan it runs.
RUNTIME_READS = "power.orchestrator.plan"
# Torch-free names the CLI's options offer, imported where the commands are declared.
TORCH_FREE_RUNTIME = "power.runtime.dtypes"


def modules() -> list[tuple[str, Path]]:
    """(dotted module name, file) for every module of the package."""
    found = []
    for path in (REPO / ROOT).rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        found.append((".".join(parts).removesuffix(".__init__"), path))
    return found


def imports(module: str, path: Path) -> list[tuple[str, bool]]:
    """(imported power module, whether the import runs inside a function) for one file."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    inside: set[int] = {id(node) for func in ast.walk(tree) if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef))
                        for node in ast.walk(func)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            name = ".".join(part for part in (base, node.module or "") if part)
            names = [name] if node.module else [f"{name}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [(name, id(node) in inside) for name in names if name == ROOT or name.startswith(ROOT + ".")]
    return found


def layer(module: str) -> str:
    return next((name for name in ALLOWED if name != ROOT and (module == name or module.startswith(name + "."))), ROOT)


@pytest.mark.parametrize(("module", "path"), modules(), ids=lambda value: str(value) if isinstance(value, str) else "")
def test_a_module_imports_only_its_own_layer_and_those_below(module, path):
    own = layer(module)
    for imported, lazily in imports(module, path):
        target = layer(imported)
        if target in ALLOWED[own]:
            continue
        if own == "power.runtime" and imported.startswith(RUNTIME_READS):
            continue
        if own == "power.orchestrator" and target == "power.runtime" and (
                imported.startswith(TORCH_FREE_RUNTIME) or (lazily and module.startswith("power.orchestrator.commands"))):
            continue  # run, serve and bench load the runtime when they run, never when the CLI starts
        pytest.fail(f"{module} ({path.relative_to(REPO)}) imports {imported}: {own} may import only "
                    f"{', '.join(sorted(ALLOWED[own]))}")


def test_the_scan_sees_every_layer_and_the_runtime_reading_its_plan():
    seen = {(layer(module), imported) for module, path in modules() for imported, _ in imports(module, path)}
    assert {layer(module) for module, _ in modules()} == set(ALLOWED)
    assert ("power.runtime", RUNTIME_READS) in seen
