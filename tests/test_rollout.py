"""`power rollout`: plan -> canary -> waves -> all, each stage gated by evidence files; a rollback restores the plans."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from evidence_helpers import write_evidence
from fleet_world import World, build_world
from hostile_documents import JSON_CASES, hostile

from power.app.cli import main
from power.orchestrator.fleet.lock import read_lock

HOSTS = "".join(f'''
[[hosts]]
name = "ws-{n}"
devices = [{{ model = "RTX 4090", vram = "24 GiB" }}]
{'labels = { rollout = "canary" }' if n == 2 else ''}
''' for n in range(1, 5))

DEPLOYMENTS = "".join(f'''
[[deployments]]
host = "ws-{n}"
manifest = "manifests/hybrid.toml"
profile = "profiles/balanced.toml"
traffic = "{'echo' if n == 3 else 'prose'}"
''' for n in range(1, 5))


def run(*args: str):
    return CliRunner().invoke(main, [*map(str, args)])


@pytest.fixture()
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    monkeypatch.setenv("POWER_CACHE_DIR", str(tmp_path / "cache"))
    world = build_world(tmp_path / "world")
    fleet = world.fleet(HOSTS, DEPLOYMENTS)
    assert run("fleet", "review", fleet, "--write-lock").exit_code == 0
    return world


def evidence(path: Path, candidate: str, baseline: str, **options) -> Path:
    """An evidence document through the one evidence schema (docs/bench.md), with the figures the test chooses."""
    return write_evidence(path, candidate, baseline, **options)


def _lock(world: World):
    return _lock_at(world.lock)


def _pair(world: World, key: str) -> tuple[str, str]:
    lock = _lock(world)
    return lock.rollout["candidates"][key]["plan_digest"], lock.deployments[key]["plan_digest"]


def test_a_full_rollout_walks_canary_waves_all_then_rolls_back(world: World, tmp_path: Path) -> None:
    fleet = world.root / "fleet.toml"
    incumbents = {key: record["plan_digest"] for key, record in _lock(world).deployments.items()}

    planned = run("rollout", "plan", fleet, "--profile", world.root / "profiles" / "guarded.toml", "--waves", "2")
    assert planned.exit_code == 0, planned.output
    stages = [(stage["name"], stage["keys"]) for stage in _lock(world).rollout["stages"]]
    assert stages == [("canary", ["ws-2/hybrid"]), ("wave-1", ["ws-1/hybrid", "ws-3/hybrid"]), ("all", ["ws-4/hybrid"])]

    before = world.lock.read_bytes()
    refused = run("rollout", "advance", fleet)
    assert refused.exit_code == 1
    assert "PWR070" in refused.output and "stage canary" in refused.output and "power bench" in refused.output
    assert world.lock.read_bytes() == before

    candidate, incumbent = _pair(world, "ws-2/hybrid")
    assert incumbent == incumbents["ws-2/hybrid"] and candidate != incumbent
    status = run("rollout", "status", fleet, "--export-plans", tmp_path / "plans")
    assert status.exit_code == 0 and "canary   next" in status.output
    assert (f"ws-2/hybrid: power bench PLANS/{candidate[:12]}.json --vs PLANS/{incumbent[:12]}.json "
            "--shapes prose,identity --engine power -o evidence.json") in status.output
    assert {p.name for p in (tmp_path / "plans").iterdir()} == {f"{candidate[:12]}.json", f"{incumbent[:12]}.json"}

    canary = run("rollout", "advance", fleet, "--evidence", evidence(tmp_path / "canary.json", candidate, incumbent))
    assert canary.exit_code == 0, canary.output
    assert _lock(world).deployments["ws-2/hybrid"]["plan_digest"] == candidate
    assert _lock(world).deployments["ws-1/hybrid"]["plan_digest"] == incumbents["ws-1/hybrid"]
    reviewed = run("fleet", "review", fleet)
    assert "Rollout of guarded: in-progress (canary applied, wave-1 next, all pending)" in reviewed.output
    during = world.lock.read_bytes()
    overwrite = run("fleet", "review", fleet, "--write-lock")
    assert overwrite.exit_code == 1 and "PWR076" in overwrite.output and world.lock.read_bytes() == during
    page = tmp_path / "report.html"
    assert run("fleet", "report", fleet, "-o", page).exit_code == 0
    html = page.read_text()
    assert "Rollout of guarded: in-progress" in html
    assert '<tr class="stage applied"><td>canary</td><td>applied</td><td>ws-2/hybrid</td></tr>' in html
    assert '<tr class="stage next"><td>wave-1</td>' in html

    # All four hosts share one (candidate, incumbent) pair: one evidence file serves every stage.
    wave = run("rollout", "advance", fleet, "--evidence", evidence(tmp_path / "wave.json", candidate, incumbent))
    assert wave.exit_code == 0, wave.output
    done = run("rollout", "advance", fleet, "--evidence", tmp_path / "wave.json", "--json")
    assert done.exit_code == 0
    assert json.loads(done.output)["rollout"]["status"] == "complete"
    assert {record["plan_digest"] for record in _lock(world).deployments.values()} == {candidate}
    assert run("rollout", "advance", fleet).exit_code == 1  # nothing left to advance

    rolled = run("rollout", "rollback", fleet)
    assert rolled.exit_code == 0, rolled.output
    lock = _lock(world)
    assert {key: record["plan_digest"] for key, record in lock.deployments.items()} == incumbents
    assert lock.rollout["status"] == "rolled-back"
    assert "rolled back" in run("rollout", "status", fleet).output


def test_each_gate_refuses_with_its_own_finding(world: World, tmp_path: Path) -> None:
    fleet = world.root / "fleet.toml"
    assert run("rollout", "plan", fleet, "--profile", world.root / "profiles" / "guarded.toml",
               "--canary", "ws-3").exit_code == 0
    candidate, incumbent = _pair(world, "ws-3/hybrid")
    before = world.lock.read_bytes()
    cases = {
        "PWR072": evidence(tmp_path / "lossy.json", candidate, incumbent, lossless=False),
        "PWR073": evidence(tmp_path / "slow.json", candidate, incumbent, speedup=0.9),
        "'no difference'": evidence(tmp_path / "flat.json", candidate, incumbent, speedup=1.02),
        "too few to tell a speedup from noise": evidence(tmp_path / "one-run.json", candidate, incumbent, runs=1),
        "PWR074": evidence(tmp_path / "fallback.json", candidate, incumbent, fallbacks=1),
    }
    for code, path in cases.items():
        result = run("rollout", "advance", fleet, "--evidence", path)
        assert result.exit_code == 1 and code in result.output, (code, result.output)
    no_echo = run("rollout", "advance", fleet, "--evidence",
                  evidence(tmp_path / "prose-only.json", candidate, incumbent, shapes=("prose",)))
    assert no_echo.exit_code == 1 and "no measurement on the 'echo' traffic" in no_echo.output
    other = run("rollout", "advance", fleet, "--evidence", evidence(tmp_path / "other.json", "f" * 64, incumbent))
    assert other.exit_code == 1 and "PWR070" in other.output
    unpaired = evidence(tmp_path / "unpaired.json", candidate, incumbent)
    document = json.loads(unpaired.read_text())
    unpaired.write_text(json.dumps(document | {"baseline": None}))
    assert "ran without a baseline" in run("rollout", "advance", fleet, "--evidence", unpaired).output
    garbage = tmp_path / "garbage.json"
    garbage.write_text("not json")
    assert "PWR071" in run("rollout", "advance", fleet, "--evidence", garbage).output
    assert world.lock.read_bytes() == before
    # The guarded K7/S6 candidate may replay once per request (4 requests per shape here), not more.
    too_many = evidence(tmp_path / "too-many-replays.json", candidate, incumbent, replays=5)
    assert run("rollout", "advance", fleet, "--evidence", too_many).exit_code == 1
    once_each = evidence(tmp_path / "replays.json", candidate, incumbent, replays=4)
    assert run("rollout", "advance", fleet, "--evidence", once_each).exit_code == 0


def test_hostile_evidence_files_are_findings_and_leave_the_lock_as_it_is(world: World, tmp_path: Path) -> None:
    fleet = world.root / "fleet.toml"
    assert run("rollout", "plan", fleet, "--profile", world.root / "profiles" / "guarded.toml").exit_code == 0
    before = world.lock.read_bytes()
    for case in JSON_CASES:
        result = run("rollout", "advance", fleet, "--evidence", hostile(tmp_path, case))
        assert result.exit_code == 1 and "PWR071" in result.output and "Traceback" not in result.output, case
    assert world.lock.read_bytes() == before


def test_a_rollback_after_the_canary_restores_only_the_canary(world: World, tmp_path: Path) -> None:
    fleet = world.root / "fleet.toml"
    assert run("rollout", "plan", fleet, "--profile", world.root / "profiles" / "guarded.toml").exit_code == 0
    original = {key: record["plan_digest"] for key, record in _lock(world).deployments.items()}
    candidate, incumbent = _pair(world, "ws-2/hybrid")
    assert run("rollout", "advance", fleet, "--evidence", evidence(tmp_path / "e.json", candidate, incumbent)).exit_code == 0
    assert run("rollout", "plan", fleet, "--profile", world.root / "profiles" / "guarded.toml").exit_code == 1
    result = run("rollout", "rollback", fleet)
    assert result.exit_code == 0 and "restored ws-2/hybrid" in result.output
    assert {key: record["plan_digest"] for key, record in _lock(world).deployments.items()} == original


def test_an_edited_profile_stops_the_rollout(world: World, tmp_path: Path) -> None:
    fleet = world.root / "fleet.toml"
    profile = world.root / "profiles" / "guarded.toml"
    assert run("rollout", "plan", fleet, "--profile", profile).exit_code == 0
    candidate, incumbent = _pair(world, "ws-2/hybrid")
    profile.write_text(profile.read_text().replace("ctx = 2048", "ctx = 1024"))
    result = run("rollout", "advance", fleet, "--evidence", evidence(tmp_path / "e.json", candidate, incumbent))
    assert result.exit_code == 1 and "PWR075" in result.output


def test_a_profile_that_cannot_plan_everywhere_is_rolled_out_to_a_selection(world: World) -> None:
    fleet = world.fleet(HOSTS + '[[hosts]]\nname = "ws-5"\ndevices = [{ model = "RTX 3090", vram = "24 GiB" }]\n',
                        DEPLOYMENTS + '[[deployments]]\nhost = "ws-5"\nmanifest = "manifests/dense.toml"\n'
                                      'profile = "profiles/ngram.toml"\n')
    assert run("fleet", "review", fleet, "--write-lock").exit_code == 0
    guarded = world.root / "profiles" / "guarded.toml"
    before = world.lock.read_bytes()
    everywhere = run("rollout", "plan", fleet, "--profile", guarded)
    assert everywhere.exit_code == 1 and world.lock.read_bytes() == before  # the dense target has no MTP head
    nothing = run("rollout", "plan", fleet, "--profile", guarded, "--deployments", "nothing/*")
    assert nothing.exit_code == 1 and "no deployment key matches 'nothing/*'" in nothing.output
    selected = run("rollout", "plan", fleet, "--profile", guarded, "--deployments", "*/hybrid")
    assert selected.exit_code == 0, selected.output
    lock = _lock(world)
    assert "ws-5/dense" not in lock.rollout["candidates"] and "ws-5/dense" in lock.deployments


@pytest.mark.slow
def test_the_gate_reads_real_power_bench_evidence(world: World, tmp_path: Path) -> None:
    """A real `power bench` of the candidate against the incumbent opens the stage exactly when its verdicts say so."""
    fleet = world.fleet('[[hosts]]\nname = "ws-1"\ndevices = [{ model = "RTX 4090", vram = "24 GiB" }]\n',
                        '[[deployments]]\nhost = "ws-1"\nmanifest = "manifests/dense.toml"\n'
                        'profile = "profiles/target-only.toml"\ntraffic = "identity"\n', name="bench-fleet.toml")
    lock = world.root / "bench.lock"
    assert run("fleet", "review", fleet, "--lock", lock, "--write-lock").exit_code == 0
    assert run("rollout", "plan", fleet, "--lock", lock, "--profile", world.root / "profiles" / "ngram.toml").exit_code == 0
    plans = tmp_path / "plans"
    assert run("rollout", "status", fleet, "--lock", lock, "--export-plans", plans).exit_code == 0
    state, _ = read_lock(lock, "lab")
    candidate = state.rollout["candidates"]["ws-1/dense"]["plan_digest"]
    incumbent = state.deployments["ws-1/dense"]["plan_digest"]
    evidence_path = tmp_path / "evidence.json"
    bench = run("bench", plans / f"{candidate[:12]}.json", "--vs", plans / f"{incumbent[:12]}.json",
                "--shapes", "identity", "--runs", "3", "--max-tokens", "8", "--threads", "1", "--prompt-tokens", "48",
                "-o", evidence_path)
    assert bench.exit_code == 0, bench.output
    measured = json.loads(evidence_path.read_text())
    identity = measured["shapes"]["identity"]
    opens = measured["lossless"]["proven"] and identity["verdict"] == "faster" and identity["candidate"]["fallbacks"] == 0
    result = run("rollout", "advance", fleet, "--lock", lock, "--evidence", evidence_path)
    assert result.exit_code == (0 if opens else 1), result.output
    if not opens:
        assert f"the bench's verdict is {identity['verdict']!r}" in result.output
    assert (_lock_at(lock).deployments["ws-1/dense"]["plan_digest"] == candidate) == opens


def _lock_at(path: Path):
    lock, findings = read_lock(path, "lab")
    assert findings == []
    return lock


def test_the_gate_trusts_the_evidences_numbers_not_its_verdict_string(world: World, tmp_path: Path) -> None:
    """Issue 26 (low): evidence that says "faster" (and 1.4x) while its own rates give 0.5x opened a stage."""
    fleet = world.root / "fleet.toml"
    assert run("rollout", "plan", fleet, "--profile", world.root / "profiles" / "guarded.toml",
               "--canary", "ws-3").exit_code == 0
    candidate, incumbent = _pair(world, "ws-3/hybrid")
    path = evidence(tmp_path / "forged.json", candidate, incumbent, speedup=1.4)
    document = json.loads(path.read_text())
    for result in document["shapes"].values():
        result["candidate"]["decode_tok_s"] = 10.0  # the incumbent's 20: 0.5x
    path.write_text(json.dumps(document))
    before = world.lock.read_bytes()
    result = run("rollout", "advance", fleet, "--evidence", path)
    assert result.exit_code == 1 and "PWR073" in result.output and "give 0.500x" in result.output
    assert world.lock.read_bytes() == before
