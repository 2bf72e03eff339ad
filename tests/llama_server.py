"""The real llama-server for tests: built by scripts/build-llama-server (cached per version) and launched from renders.

`binary()` returns the cached binary (building it on first use, about 15 minutes on 2 cores);
`Server` runs one rendered command line on a free loopback port and stops it.
"""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@cache
def binary() -> Path:
    built = subprocess.run([str(REPO / "scripts" / "build-llama-server")], capture_output=True, text=True)
    if built.returncode != 0:
        pytest.fail(f"scripts/build-llama-server failed:\n{built.stderr[-3000:]}")
    return Path(built.stdout.strip().splitlines()[-1])
