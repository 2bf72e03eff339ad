"""scripts/gpu-check: refuses without a CUDA device, and its checks and JSON writer run under Triton's interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = os.environ | {"CUDA_VISIBLE_DEVICES": ""} | (env or {})
    return subprocess.run([*args], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600, check=False)


def test_without_a_cuda_device_it_refuses_with_exit_2_and_writes_nothing(tmp_path):
    out = tmp_path / "gpu-check.json"
    result = run(str(ROOT / "scripts" / "gpu-check"), "--out", str(out))
    assert result.returncode == 2
    assert "no CUDA device" in result.stderr
    assert not out.exists()


@pytest.mark.slow  # the whole check under the interpreter: a few minutes on 2 shared cores
def test_the_checks_pass_under_the_interpreter_and_every_figure_lands_in_one_json(tmp_path):
    out = tmp_path / "figures" / "gpu-check.json"
    result = run(sys.executable, "-m", "power.app.gpu_check", "--interpret", "--out", str(out), "--work", str(tmp_path),
                 env={"TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["interpreted"] is True and report["passed"] is True
    types = report["checks"]["qmatmul"]["types"]
    assert sorted(types) == ["F16", "Q4_0", "Q4_K", "Q5_0", "Q5_K", "Q6_K", "Q8_0"]
    assert all(t["row_count_invariant"] and t["exact_inputs_equal"] and t["within_fp32_bound"] for t in types.values())
    checks = report["checks"]
    assert checks["speculation_fixture"]["proposed"] > 0
    assert all(checks["attention"][f"window_{w}"]["row_count_invariant"] for w in (0, 128))
    assert checks["attention"]["cache_write_equal"] and checks["rms_norm"]["passed"]
    assert checks["real_rows"]["real_rows"] is True  # the GPU path's trunk runs real rows (docs/runtime.md)
    graphs = checks["cuda_graphs"]
    assert graphs["recorder"] == "rerun" and graphs["plain_logits_same_bits"] and graphs["speculative_proposed"] > 0
    assert graphs["two_slots_rows_captured"] == [4]
    bench = report["bench"]
    assert bench["cuda_graphs"] is False  # the interpreter's stand-in measures no graph
    assert all(bench[f"forward_{rows}_rows{label}_tok_s"] > 0 for rows in (1, 8) for label in ("", "_graphs"))
