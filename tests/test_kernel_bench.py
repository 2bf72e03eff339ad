"""The kernel bench on a machine without a GPU: it says it needs one, measures nothing and exits 0."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

# Outside `scripts/test --fast` (slow): interpreter-heavy.
pytestmark = [pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the bench measures for minutes"),
              pytest.mark.slow]


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "power.kernels.bench", *args], capture_output=True, text=True,
                          timeout=120)


def test_without_a_gpu_it_says_so_and_exits_zero():
    done = bench()
    assert done.returncode == 0
    assert "Traceback" not in done.stderr
    assert "on a CUDA GPU; none is present here, so nothing was measured" in done.stdout


def test_json_reports_that_nothing_was_measured():
    done = bench("--json")
    assert done.returncode == 0
    report = json.loads(done.stdout)
    assert report["measured"] is False and report["device"] is None
