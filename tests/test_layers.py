"""The layers import only downward, as docs/architecture.md draws them: every module's imports, read with `ast`."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOT = "power"  # power.modes, power.findings, power.codes: below every layer

# layer -> the layers its modules may import (itself included). The orchestrator and the runtime import neither each
# other nor the application; what they exchange (plan, receipt) is the documents layer below both.
BELOW_BOTH = {ROOT, "power.artifacts", "power.documents"}
ALLOWED = {
    ROOT: {ROOT},
    "power.artifacts": {ROOT, "power.artifacts"},
    "power.documents": {ROOT, "power.artifacts", "power.documents"},
    "power.kernels": {"power.kernels"},
    "power.orchestrator": BELOW_BOTH | {"power.orchestrator"},
    "power.runtime": BELOW_BOTH | {"power.kernels", "power.runtime"},
    "power.drafters": BELOW_BOTH | {"power.kernels", "power.runtime", "power.drafters"},
    "power.serving": BELOW_BOTH | {"power.runtime", "power.serving"},
    "power.app": BELOW_BOTH | {"power.kernels", "power.orchestrator", "power.runtime", "power.drafters",
                               "power.serving",
                               "power.app"},
}


def modules() -> list[tuple[str, Path]]:
    """(dotted module name, file) for every module of the package."""
    found = []
    for path in (REPO / ROOT).rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        found.append((".".join(parts).removesuffix(".__init__"), path))
    return found


def imports(module: str, path: Path) -> list[str]:
    """The power modules one file imports, at the top or inside a function alike."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
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
        found += [name for name in names if name == ROOT or name.startswith(ROOT + ".")]
    return found


def layer(module: str) -> str:
    return next((name for name in ALLOWED if name != ROOT and (module == name or module.startswith(name + "."))), ROOT)


@pytest.mark.parametrize(("module", "path"), modules(), ids=lambda value: str(value) if isinstance(value, str) else "")
def test_a_module_imports_only_its_own_layer_and_those_below(module, path):
    own = layer(module)
    for imported in imports(module, path):
        assert layer(imported) in ALLOWED[own], (
            f"{module} ({path.relative_to(REPO)}) imports {imported}: {own} may import only "
            f"{', '.join(sorted(ALLOWED[own]))}")


def test_the_scan_sees_every_layer_and_both_halves_reading_the_plan():
    seen = {(layer(module), imported) for module, path in modules() for imported in imports(module, path)}
    assert {layer(module) for module, _ in modules()} == set(ALLOWED)
    assert {("power.runtime", "power.documents.plan"), ("power.orchestrator", "power.documents.plan")} <= seen


ORCHESTRATOR = "power.orchestrator"


def test_the_orchestrators_modules_live_in_folders_that_import_each_other_without_a_cycle():
    """The pipeline shows in the folders (docs/architecture.md, "The orchestrator's floors"): no module loose on the
    top floor, and no two folders importing each other, directly or round a loop."""
    def folder(module: str) -> str:
        return module.removeprefix(ORCHESTRATOR + ".").split(".")[0]

    inside = [(module, path) for module, path in modules() if module.startswith(ORCHESTRATOR + ".")]
    assert [module for module, path in inside if path.parent == REPO / "power" / "orchestrator"] == []
    graph: dict[str, set[str]] = {folder(module): set() for module, _ in inside}
    for module, path in inside:
        graph[folder(module)] |= {folder(name) for name in imports(module, path)
                                  if name.startswith(ORCHESTRATOR + ".") and folder(name) != folder(module)}
    assert list(graphlib.TopologicalSorter(graph).static_order())


def packages(path: Path) -> set[str]:
    """The top-level packages one file imports (absolute imports only)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_one_module_writes_gguf_with_the_gguf_package():
    """The drafter export and the fixtures write through power.artifacts.gguf_writer; headers are read by Power's own
    reader, so nothing else imports the `gguf` package."""
    assert {module for module, path in modules() if "gguf" in packages(path)} == {"power.artifacts.gguf_writer"}
