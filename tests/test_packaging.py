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


def packages_in_tree() -> set[str]:
    """Every directory with an __init__.py under power/, as a dotted name."""
    return {".".join(init.parent.relative_to(REPO).parts) for init in (REPO / "power").rglob("__init__.py")
            if "__pycache__" not in init.parts}


def test_the_package_is_one_folder_tree_with_no_remapping():
    setuptools = tomli.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "package-dir" not in setuptools
    assert setuptools["packages"]["find"]["include"] == ["power*"]


def test_the_editable_install_imports_from_the_working_tree():
    assert Path(power.orchestrator.__file__) == REPO / "power" / "orchestrator" / "__init__.py"


def test_a_built_wheel_installs_and_imports_the_three_namespaces(tmp_path):
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "power", source / "power", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "--wheel-dir",
         str(tmp_path / "dist"), str(source)],
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
    assert "power/orchestrator/engines/llama_server/llama-server-flags.json" in names
    entry_points = next(name for name in names if name.endswith("entry_points.txt"))
    assert "power = power.app.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()

    # -S skips .pth files, so the editable install's finder is absent; dependencies still come from the venv.
    site = tmp_path / "site"
    python_path = os.pathsep.join([str(site), sysconfig.get_paths()["purelib"]])
    probe = "import importlib; print('\\n'.join(importlib.import_module(n).__file__ for n in %r))" % NAMESPACES
    result = subprocess.run([sys.executable, "-S", "-c", probe], env={"PYTHONPATH": python_path}, cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert [Path(line) for line in result.stdout.split()] == [
        site / name.replace(".", "/") / "__init__.py" for name in NAMESPACES
    ]
