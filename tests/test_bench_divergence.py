"""Greedy divergence explained on the real llama-server: the candidate's target read without speculation at the first
divergence, a flip between near-tied tokens a `near-tie`, a token swapped at a clear margin `lossy`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from llama_server import binary
from swapping_proxy import SWAP_AT, SWAPPED

from power.app.cli import main

pytestmark = pytest.mark.llama_server  # outside `scripts/test --fast`: launches the real llama-server

REPO = Path(__file__).resolve().parent.parent
MANIFEST = REPO / "examples" / "fleet" / "manifests" / "gemma3-270m.toml"
PROFILES = REPO / "examples" / "fleet" / "profiles"


def run(*args):
    return CliRunner().invoke(main, [*map(str, args)])


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("divergence")
    paths = []
    for name in ("ngram", "target-only"):
        path = folder / f"{name}.json"
        planned = run("plan", MANIFEST, PROFILES / f"{name}.toml", "--device", "16 GiB", "--engine", "llama-server",
                      "-o", path)
        assert planned.exit_code == 0, planned.output
        paths.append(path)
    return paths[0], paths[1]


def test_a_token_swapped_at_a_clear_margin_is_lossy(plans, tmp_path: Path) -> None:
    candidate, baseline = plans
    wrong = tmp_path / "llama-server"
    wrong.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).parent / 'swapping_proxy.py'} {binary()} \"$@\"\n")
    wrong.chmod(0o755)
    evidence = tmp_path / "evidence.json"
    result = run("bench", candidate, "--vs", baseline, "--engine", "llama-server", "--engine-binary", wrong,
                 "--shapes", "identity", "--runs", 3, "--max-tokens", 8, "--threads", 1, "-o", evidence)
    assert result.exit_code == 1, result.output  # lossy
    identity = json.loads(evidence.read_text())["shapes"]["identity"]
    assert identity["exactness"] == "lossy" and identity["verdict"] == "lossy"
    first = identity["divergences"][0]
    assert first["position"] == SWAP_AT and first["candidate_token"] == SWAPPED
    # the target's own top token there is the baseline's, by far more than the margin
    assert first["target_top_token"] == first["baseline_token"] and first["baseline_logprob"] is not None
    assert first["margin"] is not None and first["margin"] > identity["near_tie_margin"]
    assert f"differ at token {SWAP_AT}" in identity["verdict_reason"]
