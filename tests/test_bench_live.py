"""`power bench --engine llama-server`: the A/B protocol against the real llama-server launched from the plans'
renders, its evidence bound to the engine, and a rollout that takes it for a llama-server deployment only."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner
from llama_server import binary

from power.app.bench.harness import winner
from power.app.cli import main
from power.orchestrator.fleet.lock import read_lock

# outside `scripts/test --fast`: launches the real llama-server; the README's bench (nine pairs a shape) runs past the
# default 15 minutes on a busy 2-core host
pytestmark = [pytest.mark.llama_server, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parent.parent
FLEET = REPO / "examples" / "fleet" / "llama-server.toml"
CANDIDATE_PROFILE = REPO / "examples" / "fleet" / "profiles" / "ngram.toml"
LLAMA_KEY, POWER_KEY = "cpu-1/gemma3-270m", "cpu-2/gemma3-270m"


def run(*args):
    return CliRunner().invoke(main, [*map(str, args)])


def documented(command: str, **words: str) -> list[str]:
    """A command of examples/fleet/README.md step 5 as written, its placeholders filled: `<candidate>` and
    `<incumbent>` with the exported plans' names, the build script's output with the test's llama-server."""
    section = (REPO / "examples" / "fleet" / "README.md").read_text().split("## 5.")[1]
    lines = "\n".join(re.findall(r"```sh\n(.*?)```", section, re.S)).replace("\\\n", " ").splitlines()
    line = next(line for line in lines if line.startswith(f"power {command} "))
    for placeholder, word in words.items():
        line = line.replace(f"<{placeholder}>", word)
    return [str(binary()) if word == "$(scripts/build-llama-server)" else word
            for word in shlex.split(line.split("   #")[0])[1:]]


@pytest.fixture(scope="module")
def rollout(tmp_path_factory):
    """The example fleet's rollout of the n-gram profile, planned, with its plans exported and the README's bench
    run as written, from a folder of its own (where the README's relative plans/ and evidence.json lie)."""
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
    here = Path.cwd()
    os.chdir(root)
    try:
        bench = run(*documented("bench", candidate=candidate[:12], incumbent=incumbent[:12]))
    finally:
        os.chdir(here)
    assert bench.exit_code == 0, bench.output
    evidence = root / "evidence.json"
    return lock, json.loads(evidence.read_text()), evidence, root / "cpu-1.env", bench.output


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
    assert document["shapes"]["echo"]["candidate"]["generated_tokens"] == 64


def test_the_winner_is_written_as_the_deployments_llama_arg_env_file(rollout):
    _, document, _, env, _ = rollout
    text = env.read_text()
    assert text.startswith("# power bench on llama-server:") and "# echo" in text
    assert winner([document]) is not None
    assert "LLAMA_ARG_SPEC_TYPE=ngram-mod" in text and "the winner: candidate" in text
    assert "LLAMA_ARG_N_PARALLEL=1" in text and "LLAMA_ARG_ENDPOINT_METRICS=true" in text


def test_the_documented_bench_opens_the_canary_of_the_llama_server_deployment(rollout):
    """Issue 40.3: examples/fleet/README.md step 5 says `rollout advance` opens the canary; the live bench gave a
    2.78x median, refused under noise (the runs' ranges overlapped). Judged from the pairs, it opens, as written."""
    lock, document, evidence, _, _ = rollout
    echo = document["shapes"]["echo"]
    assert echo["verdict"] == "faster", echo["verdict_reason"]
    advance = documented("rollout advance")
    assert advance[advance.index("--evidence") + 1] == "evidence.json"
    advance[advance.index("--lock") + 1] = str(lock)
    advance[advance.index("--evidence") + 1] = str(evidence)
    advanced = run(*[str(FLEET) if word == "examples/fleet/llama-server.toml" else word for word in advance])
    assert advanced.exit_code == 0, advanced.output
    state, _ = read_lock(lock, "cpu-lab")
    assert state.deployments[LLAMA_KEY]["engine"] == "llama-server"
    assert state.deployments[LLAMA_KEY]["plan_digest"] == state.rollout["candidates"][LLAMA_KEY]["plan_digest"]


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
