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
    wrong.write_text(f"#!/bin/sh\nexec {sys.executable} "
                     f"{Path(__file__).parent / 'swapping_proxy.py'} {binary()} \"$@\"\n")
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


def test_the_real_ngram_divergence_on_prose_is_a_near_tie_with_its_margin(plans, tmp_path: Path) -> None:
    """This CPU llama-server's n-gram line parts from its target-only line on prose where the target's own top two
    tokens are a few hundredths of a nat apart (its verification batch and plain decode round differently)."""
    candidate, baseline = plans
    evidence = tmp_path / "evidence.json"
    result = run("bench", candidate, "--vs", baseline, "--engine", "llama-server", "--engine-binary", binary(),
                 "--shapes", "prose", "--runs", 3, "--max-tokens", 64, "--threads", 1, "-o", evidence)
    assert result.exit_code == 0, result.output  # a near-tie is not lossy
    prose = json.loads(evidence.read_text())["shapes"]["prose"]
    assert not prose["parity"] and prose["exactness"] == "near-tie" and prose["divergences"]
    for divergence in prose["divergences"]:
        assert divergence["baseline_token"] != divergence["candidate_token"]
        assert divergence["margin"] == pytest.approx(
            abs(divergence["baseline_logprob"] - divergence["candidate_logprob"])
        )
        assert divergence["margin"] <= prose["near_tie_margin"]
        # the replay runs the candidate's own target: its top token is one of the two
        assert divergence["target_top_token"] in (divergence["baseline_token"], divergence["candidate_token"])
    assert "near-tie" in result.output and f"within {max(d['margin'] for d in prose['divergences']):.4f} nats" in \
        prose["verdict_reason"]
