"""`power bench --engine llama-server`: the A/B protocol against the real llama-server launched from the plans'
renders, its evidence bound to the engine, and a rollout that takes it for a llama-server deployment only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from llama_server import binary

from power.app.bench import winner
from power.app.cli import main
from power.orchestrator.fleet.lock import read_lock

pytestmark = pytest.mark.llama_server  # outside `scripts/test --fast`: launches the real llama-server

REPO = Path(__file__).resolve().parent.parent
FLEET = REPO / "examples" / "fleet" / "llama-server.toml"
CANDIDATE_PROFILE = REPO / "examples" / "fleet" / "profiles" / "ngram.toml"
LLAMA_KEY, POWER_KEY = "cpu-1/gemma3-270m", "cpu-2/gemma3-270m"


def run(*args):
    return CliRunner().invoke(main, [*map(str, args)])


@pytest.fixture(scope="module")
def rollout(tmp_path_factory):
    """The example fleet's rollout of the n-gram profile, planned, with its plans exported and one live bench run."""
    root = tmp_path_factory.mktemp("rollout")
    lock = root / "fleet.lock"
    assert run("fleet", "review", FLEET, "--lock", lock, "--write-lock").exit_code == 0
    planned = run("rollout", "plan", FLEET, "--lock", lock, "--profile", CANDIDATE_PROFILE)
    assert planned.exit_code == 0, planned.output
    status = run("rollout", "status", FLEET, "--lock", lock, "--export-plans", root / "plans")
    assert status.exit_code == 0 and "--engine llama-server" in status.output, status.output
    state, _ = read_lock(lock, "cpu-lab")
    candidate = state.rollout["candidates"][LLAMA_KEY]["plan_digest"]
    incumbent = state.deployments[LLAMA_KEY]["plan_digest"]
    evidence = root / "evidence.json"
    env = root / "cpu-1.env"
    bench = run("bench", root / "plans" / f"{candidate[:12]}.json", "--vs", root / "plans" / f"{incumbent[:12]}.json",
                "--engine", "llama-server", "--engine-binary", binary(), "--shapes", "echo,identity", "--runs", 3,
                "--max-tokens", 24, "--prompt-tokens", 256, "--threads", 1, "-o", evidence, "--write-env", env)
    assert bench.exit_code == 0, bench.output
    return lock, json.loads(evidence.read_text()), evidence, env, bench.output


def test_the_evidence_says_which_engine_and_build_measured_it(rollout):
    _, document, _, _, _ = rollout
    assert document["engine"]["name"] == "llama-server" and document["engine"]["build"].startswith("b")
    for role in ("candidate", "baseline"):
        assert document[role]["engine"] == document["engine"]
    receipts = [r["receipt"] for r in document["receipts"]]
    assert {r["runtime"]["engine"] for r in receipts} == {"llama-server"}
    # the engine's own counters: per request timings.draft_n / draft_n_accepted, /metrics verification steps
    echo = document["shapes"]["echo"]
    assert echo["candidate"]["draft_n"] > 0 and echo["candidate"]["draft_n_accepted"] > 0
    assert echo["baseline"]["draft_n"] == 0 and document["negative_control"]["holds"]
    assert all(r["runtime"]["counters"]["spec_decode_num_drafts_total"] == r["speculative_rounds"] for r in receipts)


def test_greedy_parity_is_proven_on_outputs_that_say_something(rollout):
    _, document, _, _, _ = rollout
    assert document["lossless"]["proven"], document["lossless"]["reason"]
    assert document["lossless"]["vacuous_shapes"] == []
    assert document["shapes"]["echo"]["candidate"]["generated_tokens"] == 24


def test_the_winner_is_written_as_the_deployments_llama_arg_env_file(rollout):
    _, document, _, env, output = rollout
    text = env.read_text()
    assert text.startswith("# power bench on llama-server:") and "# echo" in text
    won = winner([document]) is not None
    assert ("LLAMA_ARG_SPEC_TYPE=ngram-mod" in text) == won
    assert ("the winner: candidate" in text) == won
    assert "LLAMA_ARG_N_PARALLEL=1" in text and "LLAMA_ARG_ENDPOINT_METRICS=true" in text


def test_the_llama_server_evidence_decides_the_canary_of_the_llama_server_deployment(rollout):
    """The gate acts on what was measured: 'faster' on echo opens the canary, anything else keeps the incumbent."""
    lock, document, evidence, _, _ = rollout
    before = read_lock(lock, "cpu-lab")[0]
    advanced = run("rollout", "advance", FLEET, "--lock", lock, "--evidence", evidence, "--json")
    state, _ = read_lock(lock, "cpu-lab")
    echo = document["shapes"]["echo"]
    if echo["verdict"] == "faster":
        assert advanced.exit_code == 0, advanced.output
        assert state.deployments[LLAMA_KEY]["engine"] == "llama-server"
        assert state.deployments[LLAMA_KEY]["plan_digest"] == state.rollout["candidates"][LLAMA_KEY]["plan_digest"]
    else:
        assert advanced.exit_code == 1, advanced.output
        findings = json.loads(advanced.output)["findings"]
        assert any(f["code"] == "PWR073" and f"the bench's verdict is {echo['verdict']!r}" in f["message"]
                   for f in findings), findings
        assert state.deployments == before.deployments


def test_llama_server_evidence_for_a_deployment_that_runs_power_is_refused_at_its_line(tmp_path):
    """Power's plans (sized for power) measured on llama-server by mistake: PWR077 at the deployment, whatever the
    measurement said."""
    lock = tmp_path / "fleet.lock"
    assert run("fleet", "review", FLEET, "--lock", lock, "--write-lock").exit_code == 0
    planned = run("rollout", "plan", FLEET, "--lock", lock, "--profile", CANDIDATE_PROFILE, "--canary", "cpu-2")
    assert planned.exit_code == 0, planned.output
    state, _ = read_lock(lock, "cpu-lab")
    candidate = state.rollout["candidates"][POWER_KEY]["plan_digest"]
    incumbent = state.deployments[POWER_KEY]["plan_digest"]
    plans = tmp_path / "plans"
    assert run("rollout", "status", FLEET, "--lock", lock, "--export-plans", plans).exit_code == 0
    wrong = tmp_path / "wrong-engine.json"
    bench = run("bench", plans / f"{candidate[:12]}.json", "--vs", plans / f"{incumbent[:12]}.json",
                "--engine", "llama-server", "--engine-binary", binary(), "--shapes", "identity", "--runs", 1,
                "--max-tokens", 8, "--threads", 1, "-o", wrong)
    assert bench.exit_code == 0 and "was sized for power; measuring it on llama-server" in bench.output, bench.output
    refused = run("rollout", "advance", FLEET, "--lock", lock, "--evidence", wrong, "--json")
    assert refused.exit_code == 1
    [finding] = [f for f in json.loads(refused.output)["findings"] if f["code"] == "PWR077"]
    line = FLEET.read_text().splitlines().index('host = "cpu-2"', 20) + 1
    assert finding["file"] == str(FLEET) and finding["where"] == "deployments[1].host" and finding["line"] == line
    assert "runs power" in finding["message"] and "measured on llama-server" in finding["message"]
    assert read_lock(lock, "cpu-lab")[0].deployments[POWER_KEY]["plan_digest"] == incumbent
