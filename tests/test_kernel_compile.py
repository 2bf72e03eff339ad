"""Every Triton kernel compiles for sm_90 (Hopper) without register spills, on the CPU via Triton's ptxas."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # outside `scripts/test --fast`: interpreter-heavy or runs the real model for long

SCRIPT = Path(__file__).with_name("kernel_compile.py")


def test_every_kernel_compiles_for_sm90_without_spills_and_dequantisers_do_not_fuse_multiply_add():
    env = os.environ | {"TRITON_INTERPRET": "0"}
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=600)
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    failed = [r for r in results if not r["ok"]]
    assert not failed, json.dumps(failed, indent=2)
    assert done.returncode == 0, done.stderr[-2000:]
    labels = {r["kernel"] for r in results}
    for qtype in ("Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"):
        assert {f"dequantize {qtype}", f"qmatmul {qtype}"} <= labels
    assert "qmatmul F16" in labels
    assert {"partial_argmax fp32", "greedy_verify accept", "rejection draw fp64", "fr_argmax bf16"} <= labels
