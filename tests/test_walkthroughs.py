"""Every walk-through in the docs, run as written: the commands, their exit codes and the counts the text states.

examples/fleet/README.md is walked step by step in a copy of the repository's
layout (the example reaches the bundled model and the repository's Gemma
manifest through `..`), so the lock and exported plans it writes never touch
the checkout. Issue 23 defect 1: the rollout walk-through was refused at its
third command and the review's counts and sizes had drifted from the text.
docs/kubernetes.md's walk (review, render, rollout with evidence, overlays) is
tests/test_kubernetes.py's `rolled_out`, on examples/kubernetes.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from power.app.cli import main

pytestmark = pytest.mark.slow  # outside `scripts/test --fast`: interpreter-heavy or runs the real model for long

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "fleet"
README = (EXAMPLE / "README.md").read_text()


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Path:
    """A root holding examples/fleet (with its built artifacts), models/, manifests/ and profiles/ as in the repo."""
    root = tmp_path_factory.mktemp("walk")
    shutil.copytree(EXAMPLE, root / "examples" / "fleet", ignore=shutil.ignore_patterns("artifacts", "fleet.lock",
                                                                                         "plans"))
    for name in ("models", "manifests", "profiles"):
        (root / name).symlink_to(REPO / name)
    return root


def power(root: Path, command: str):
    """One README command line, run from `root` as the README runs it from the checkout."""
    import os
    import shlex

    here = Path.cwd()
    os.chdir(root)
    try:
        return CliRunner().invoke(main, shlex.split(command))
    finally:
        os.chdir(here)


def counts(output: str) -> tuple[int, int]:
    found = re.findall(r"(\d+) errors?, (\d+) warnings?", output)
    assert found, output
    return int(found[-1][0]), int(found[-1][1])


def stated(command: str) -> str:
    """The README's comment after a command: what it says the command does."""
    match = re.search(re.escape(command) + r" +# (.*)", README)
    assert match, f"the README no longer shows `{command}`"
    return match[1]


def test_the_fleet_walkthrough_runs_as_written(lab):
    built = power(lab, "fixtures build examples/fleet/artifacts")
    assert built.exit_code == 0, built.output

    review = "power fleet review examples/fleet/fleet.toml"
    assert stated(review) == "exit 1: 3 errors, 3 warnings"
    result = power(lab, review.removeprefix("power "))
    assert result.exit_code == 1 and counts(result.output) == (3, 3)
    for line in ("PWR060", "PWR062", "PWR500", "PWR502", "PWR061"):
        assert line in result.output
    section = README.split("## 2. Review")[1].split("## 3.")[0]
    for quoted in re.findall(r"^examples/fleet/\S+: (PWR\d+ \[\w+\] .*?)(?: \.\.\.)?$", section, re.M):
        assert quoted.split(" (...)")[0] in result.output, quoted
    for size in ("22.36 GiB", "42.70 GiB", "65.07 GiB", "72.75 GiB", "24.64 GiB", "4.30 GiB"):
        assert size in README and size in result.output

    write_lock = "power fleet review examples/fleet/fleet.fixed.toml --write-lock"
    assert stated(write_lock).startswith("exit 0")
    result = power(lab, write_lock.removeprefix("power "))
    assert result.exit_code == 0 and counts(result.output) == (0, 0), result.output
    assert (lab / "examples" / "fleet" / "fleet.lock").is_file()
    clean = "power fleet review examples/fleet/fleet.fixed.toml --detailed-exitcode"
    assert stated(clean) == 'exit 0: "No changes. The fleet matches the lock."'
    result = power(lab, clean.removeprefix("power "))
    assert result.exit_code == 0 and "No changes. The fleet matches the lock." in result.output

    rollout = power(lab, "rollout plan examples/fleet/fleet.fixed.toml --profile "
                         "examples/fleet/profiles/guarded-k7s6.toml --deployments 'ws-*'")
    assert rollout.exit_code == 0, rollout.output
    shown = re.search(r"```\n(rollout of guarded-k7s6:.*?)```", README, re.S)
    assert shown and rollout.output.strip().endswith(shown[1].strip())
    status = power(lab, "rollout status examples/fleet/fleet.fixed.toml --export-plans plans/")
    assert status.exit_code == 0 and "--engine llama-server -o evidence.json" in status.output
    assert stated("power rollout advance examples/fleet/fleet.fixed.toml") == "exit 1, the lock unchanged:"
    lock = (lab / "examples" / "fleet" / "fleet.lock").read_bytes()
    advance = power(lab, "rollout advance examples/fleet/fleet.fixed.toml")
    assert advance.exit_code == 1 and "PWR070" in advance.output and "--engine llama-server" in advance.output
    assert (lab / "examples" / "fleet" / "fleet.lock").read_bytes() == lock


def test_the_llama_server_fleet_walkthrough_up_to_the_bench(lab):
    """Step 5 up to the bench, as written, after step 3 recorded the lab fleet in fleet.lock
    (tests/test_bench_live.py runs the bench on the real llama-server). Issue 40.1: its --write-lock used to replace
    the lab fleet's lock."""
    if not (lab / "examples" / "fleet" / "fleet.lock").exists():  # run on its own: step 3 first
        assert power(lab, "fixtures build examples/fleet/artifacts").exit_code == 0
        assert power(lab, "fleet review examples/fleet/fleet.fixed.toml --write-lock").exit_code == 0
    section = README.split("## 5.")[1]
    commands = [line.split("   #")[0].strip() for line in re.search(r"```sh\n(.*?)```", section, re.S)[1].splitlines()
                if line.startswith("power ")]
    review, plan, status = (power(lab, command.removeprefix("power ")) for command in commands)
    assert stated(commands[0]) == 'exit 0: "recorded 2 plan(s)"'
    assert review.exit_code == 0 and counts(review.output) == (0, 0), review.output
    assert "recorded 2 plan(s)" in review.output
    assert plan.exit_code == 0, plan.output
    assert status.exit_code == 0
    assert re.search(r"cpu-1/gemma3-270m: power bench PLANS/\w+\.json --vs PLANS/\w+\.json --shapes echo,identity "
                     r"--engine llama-server -o evidence.json", status.output), status.output
    unchanged = power(lab, "fleet review examples/fleet/fleet.fixed.toml --detailed-exitcode")
    assert unchanged.exit_code == 0, unchanged.output
    refused = power(lab, "fleet review examples/fleet/llama-server.toml --write-lock")
    assert refused.exit_code == 1 and "PWR083" in refused.output


@pytest.mark.llama_server  # the documented bench launches the real llama-server
@pytest.mark.timeout(3600)  # nine pairs a shape: on a busy 2-core host, past the default 15 minutes
def test_the_kubernetes_rollout_walkthrough_opens_the_canary_as_written(tmp_path, monkeypatch):
    """docs/kubernetes.md steps 2 and 4 as written: review and render, plan the rollout, export the plans, bench the
    canary's pair on llama-server, advance with --kubernetes; then k8s/stages/canary holds the overlay the text lists.
    Issue 40.3: the advance was refused (PWR073), so the canary's folder never existed."""
    from llama_server import binary

    from power.orchestrator.fleet.lock import read_lock

    shutil.copytree(REPO / "examples" / "kubernetes", tmp_path / "examples" / "kubernetes",
                    ignore=shutil.ignore_patterns("fleet.lock"))
    (tmp_path / "models").symlink_to(REPO / "models")
    monkeypatch.setenv("POWER_LLAMA_SERVER", str(binary()))
    page = (REPO / "docs" / "kubernetes.md").read_text()
    steps = [page.split("## 2. Render")[1].split("## 3.")[0],
             page.split("## 4. Roll a profile out")[1].split("## 5.")[0]]
    commands = [line for step in steps for line in re.search(r"```sh\n(.*?)```", step, re.S)[1].splitlines()
                if line.startswith("power ")]
    assert len(commands) == 6, commands
    for command in commands[:4]:
        result = power(tmp_path, command.removeprefix("power "))
        assert result.exit_code == 0, (command, result.output)
    state, _ = read_lock(tmp_path / "examples" / "kubernetes" / "fleet.lock", "inference")
    canary = "l4-a/gemma3-270m"
    candidate = state.rollout["candidates"][canary]["plan_digest"]
    incumbent = state.deployments[canary]["plan_digest"]
    bench = commands[4].replace("<candidate>", candidate[:12]).replace("<incumbent>", incumbent[:12])
    measured = power(tmp_path, bench.removeprefix("power "))
    assert measured.exit_code == 0, measured.output
    advanced = power(tmp_path, commands[5].removeprefix("power "))
    assert advanced.exit_code == 0, advanced.output
    state, _ = read_lock(tmp_path / "examples" / "kubernetes" / "fleet.lock", "inference")
    assert state.deployments[canary]["plan_digest"] == candidate
    for listed in re.findall(r"^(k8s/stages/canary/\S+)", page, re.M):
        assert (tmp_path / listed).is_file(), listed


def test_the_plan_pages_first_command(tmp_path):
    """docs/plan.md opens with `power plan manifests/gemma3-270m.toml profiles/ngram.toml --host ... -o plan.json`."""
    page = (REPO / "docs" / "plan.md").read_text()
    command = (
        "power plan manifests/gemma3-270m.toml profiles/ngram.toml --host examples/hosts/rtx4090.toml -o plan.json"
    )
    assert command in page
    result = power(REPO, command.removeprefix("power ").replace("plan.json", str(tmp_path / "plan.json")))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "plan.json").is_file()
