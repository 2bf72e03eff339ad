"""The CPU kernels' sources as a build sees them: every instruction path compiles on any x86-64 machine, without a
warning, whether or not this CPU runs it; and the C++ kernels number the matrix kinds as Python does.

The paths this CPU runs are tested against their torch reference in tests/test_kernel_cpu_quant.py and
tests/test_kernel_cpu_rowops.py.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

from power.kernels.cpu import build as kernel_build
from power.kernels.cpu import cache
from power.kernels.cpu.layout import KINDS

POWER = [str(Path(sys.executable).parent / "power")]


def power(*args: str, cache_root: Path) -> subprocess.CompletedProcess:
    environment = {**os.environ, cache.CACHE_ENV: str(cache_root)}
    environment.pop(kernel_build.ENV_PATH, None)
    return subprocess.run([*POWER, *args], env=environment, capture_output=True, text=True, timeout=1800)


def test_the_kernels_kind_enum_is_layout_kinds_in_order():
    """The C++ `Kind` enum and `layout.KINDS` are matched by number alone (the kind is passed as an int)."""
    source = (kernel_build.CSRC / "qmatmul.cpp").read_text(encoding="utf-8")
    enums = re.findall(r"\benum\s+Kind\s*\{([^}]*)\}", source)
    assert len(enums) == 1, "qmatmul.cpp should declare `enum Kind { ... }` once"
    names = [name.strip() for name in enums[0].split(",") if name.strip()]
    assert all(re.fullmatch(r"[A-Z0-9_]+", name) for name in names), f"plain enumerators expected, got {names}"
    assert {name: index for index, name in enumerate(names)} == KINDS


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.skipif(platform.machine() != "x86_64", reason="the instruction paths are x86-64's")
def test_every_path_builds_without_a_warning_on_any_x86_machine(tmp_path):
    """All five paths compile (about a minute each on 2 quiet cores, 13 minutes in all at a load average of 10-11),
    the ones this CPU lacks included: the compiler needs only their -m flags, and a build is never loaded to be
    made."""
    root = tmp_path / "kernels"
    args = [arg for name in kernel_build.PATH_NAMES for arg in ("--path", name)]
    done = power("kernels", "build", *args, "--verbose", cache_root=root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    warnings = [line for line in done.stdout.splitlines() if "warning:" in line]
    assert not warnings, "\n".join(warnings[:20])
    runs_here = kernel_build.available_paths()
    for name in kernel_build.PATH_NAMES:
        line = next(line for line in done.stdout.splitlines() if line.startswith(f"{name}: "))
        assert line.endswith(", not run on this CPU)") == (name not in runs_here), line
    status = power("kernels", "status", "--json", cache_root=root)
    assert status.returncode == 0, status.stderr[-3000:]
    assert all(row["built"] for row in json.loads(status.stdout)["paths"])


def test_an_unknown_path_is_refused_by_name(tmp_path):
    done = power("kernels", "build", "--path", "avx1024", cache_root=tmp_path / "kernels")
    assert done.returncode == 2 and "PWR624 [error]" in done.stderr, done.stderr[-3000:]
    assert "'avx1024' is not an instruction path; choose one of amx, avx512vnni, avxvnni, avx2, scalar" in done.stderr
