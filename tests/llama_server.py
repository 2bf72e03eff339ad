"""The real llama-server for tests: the one scripts/build-llama-server builds (cached per version).

`binary()` returns `$POWER_LLAMA_SERVER` when set (scripts/test sets it from the build script), else the cached
binary, building it on first use (about 15 minutes on 2 cores). A failed build or a missing binary fails the test.
"""

from __future__ import annotations

import os
import subprocess
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@cache
def binary() -> Path:
    given = os.environ.get("POWER_LLAMA_SERVER")
    if given:
        found = Path(given)
    else:
        built = subprocess.run([str(REPO / "scripts" / "build-llama-server")], capture_output=True, text=True)
        if built.returncode != 0:
            pytest.fail(f"scripts/build-llama-server failed:\n{built.stderr[-3000:]}")
        found = Path(built.stdout.strip().splitlines()[-1])
    if not (found.is_file() and os.access(found, os.X_OK)):
        pytest.fail(f"no llama-server binary at {found}: run scripts/build-llama-server")
    return found
