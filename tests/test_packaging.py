"""The package list matches the tree, and both an editable and a normal install import the three namespaces."""

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import tomli

import power.orchestrator

REPO = Path(__file__).resolve().parents[1]
NAMESPACES = ["power.orchestrator", "power.runtime", "power.kernels"]


def setuptools_config() -> dict:
    return tomli.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def packages_in_tree() -> set[str]:
    """Every directory with an __init__.py under each package-dir root, as a dotted name."""
    found = set()
    for name, directory in setuptools_config()["package-dir"].items():
        root = REPO / directory
        for init in root.rglob("__init__.py"):
            relative = init.parent.relative_to(root).parts
            if "__pycache__" not in relative:
                found.add(".".join((name, *relative)))
    return found


def test_the_packages_list_names_every_package_directory():
    listed = set(setuptools_config()["packages"])
    missing, stale = packages_in_tree() - listed, listed - packages_in_tree()
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"
    assert not stale, f"remove from [tool.setuptools] packages (no such package directory): {sorted(stale)}"


def test_the_editable_install_imports_from_the_working_tree():
    assert Path(power.orchestrator.__file__) == REPO / "orchestrator" / "__init__.py"


def test_a_built_wheel_installs_and_imports_the_three_namespaces(tmp_path):
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for directory in {"power", *setuptools_config()["package-dir"].values()}:
        shutil.copytree(REPO / directory, source / directory, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "--wheel-dir", str(tmp_path / "dist"), str(source)],
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path / "site")
    for package in packages_in_tree():
        assert f"{package.replace('.', '/')}/__init__.py" in names
    assert {f"power/orchestrator/schemas/{kind}.json" for kind in ("manifest", "profile", "host", "fleet")} <= names
    assert "power/orchestrator/data/llama-server-flags.json" in names
    entry_points = next(name for name in names if name.endswith("entry_points.txt"))
    assert "power = power.orchestrator.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()

    # -S skips .pth files, so the editable install's finder is absent; dependencies still come from the venv.
    site = tmp_path / "site"
    python_path = os.pathsep.join([str(site), sysconfig.get_paths()["purelib"]])
    probe = "import importlib; print('\\n'.join(importlib.import_module(n).__file__ for n in %r))" % NAMESPACES
    result = subprocess.run([sys.executable, "-S", "-c", probe], env={"PYTHONPATH": python_path}, cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert [Path(line) for line in result.stdout.split()] == [site / name.replace(".", "/") / "__init__.py" for name in NAMESPACES]
