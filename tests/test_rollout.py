"""`power rollout`: plan -> canary -> waves -> all, each stage gated by evidence files; a
rollback restores the plans."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from evidence_helpers import write_evidence
from fleet_world import World, build_world
from hostile_documents import JSON_CASES, hostile

from power.app.bench import harness
from power.app.bench.traffic import build_shape
from power.app.cli import main
from power.documents.evidence import MIN_RUNS
from power.documents.receipt import Receipt
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
    claimed = evidence(tmp_path / "claimed.json", candidate, incumbent)
    document = json.loads(claimed.read_text())
    for result in document["shapes"].values():
        result["candidate"]["decode_tok_s_runs"][0] = 1.0  # a pair against the 'faster' the file states
    claimed.write_text(json.dumps(document))
    assert "the evidence says 'faster' but its own decode runs give 1.400x" in run(
        "rollout", "advance", fleet, "--evidence", claimed).output
    garbage = tmp_path / "garbage.json"
    garbage.write_text("not json")
    assert "PWR071" in run("rollout", "advance", fleet, "--evidence", garbage).output
    assert world.lock.read_bytes() == before
    # The guarded K7/S6 candidate may replay once per request (4 requests per shape here), not more.
    too_many = evidence(tmp_path / "too-many-replays.json", candidate, incumbent, replays=5)
    assert run("rollout", "advance", fleet, "--evidence", too_many).exit_code == 1
    once_each = evidence(tmp_path / "replays.json", candidate, incumbent, replays=4)
    assert run("rollout", "advance", fleet, "--evidence", once_each).exit_code == 0


def test_a_clear_median_win_whose_pairs_disagree_is_told_to_measure_again_not_to_tune(
    world: World, tmp_path: Path
) -> None:
    """Issue 40.3: a live bench gave a 2.78x median refused under noise, and PWR073 said "keep the incumbent, or tune
    K/S". The hint follows the cause: measure again; a real tie still says tune."""
    fleet = world.root / "fleet.toml"
    assert run("rollout", "plan", fleet, "--profile", world.root / "profiles" / "guarded.toml",
               "--canary", "ws-3").exit_code == 0
    candidate, incumbent = _pair(world, "ws-3/hybrid")
    noisy = evidence(tmp_path / "noisy.json", candidate, incumbent, speedup=2.78)
    document = json.loads(noisy.read_text())
    for result in document["shapes"].values():
        result["candidate"]["decode_tok_s_runs"][0] = result["baseline"]["decode_tok_s"] * 0.5  # a pair against
        result["judged"]["decode"] = result["verdict"] = "no difference"
    noisy.write_text(json.dumps(document))
    refused = run("rollout", "advance", fleet, "--evidence", noisy)
    assert refused.exit_code == 1 and "PWR073" in refused.output, refused.output
    assert "measure again with more runs (--runs 6 or more) or on a quieter host" in refused.output
    assert "2.78x" in refused.output and "tune K/S" not in refused.output
    tie = run("rollout", "advance", fleet, "--evidence", evidence(tmp_path / "tie.json", candidate, incumbent,
                                                                  speedup=1.02))
    assert tie.exit_code == 1 and "tune K/S" in tie.output and "quieter host" not in tie.output


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
    assert run("rollout", "advance", fleet, "--evidence", evidence(tmp_path / "e.json", candidate,
                                                                   incumbent)).exit_code == 0
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
    assert run("rollout", "plan", fleet, "--lock", lock, "--profile",
               world.root / "profiles" / "ngram.toml").exit_code == 0
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
    opens = (
        measured["lossless"]["proven"] and identity["verdict"] == "faster" and identity["candidate"]["fallbacks"] == 0
    )
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
    """Issue 26 (low): evidence that says "faster" (and 1.4x) while its own runs give 0.5x opened a stage."""
    fleet = world.root / "fleet.toml"
    assert run("rollout", "plan", fleet, "--profile", world.root / "profiles" / "guarded.toml",
               "--canary", "ws-3").exit_code == 0
    candidate, incumbent = _pair(world, "ws-3/hybrid")
    path = evidence(tmp_path / "forged.json", candidate, incumbent, speedup=1.4)
    document = json.loads(path.read_text())
    for result in document["shapes"].values():
        runs = len(result["candidate"]["decode_tok_s_runs"])
        result["candidate"] |= {"decode_tok_s": 10.0, "decode_tok_s_runs": [10.0] * runs}  # the incumbent's 20: 0.5x
    path.write_text(json.dumps(document))
    before = world.lock.read_bytes()
    result = run("rollout", "advance", fleet, "--evidence", path)
    assert result.exit_code == 1 and "PWR073" in result.output and "give 0.500x" in result.output
    assert world.lock.read_bytes() == before


def _recorded(decode_tok_s: float, request_tok_s: float, tokens: int = 256) -> list[Receipt]:
    """Three runs whose engine timings give the recorded decode and request-wide rates for `tokens` tokens."""
    decode_s = (tokens - 1) / decode_tok_s
    receipt = Receipt(plan_digest="p", artifacts={}, mode="mtp", prompt_tokens=1024, token_ids=list(range(tokens)),
                      text="recorded", stop_reason="length", rounds=tokens // 4, proposed=tokens, accepted=tokens // 2,
                      replays=0, clamps=0, fallbacks=0, load_s=0.0, prefill_s=tokens / request_tok_s - decode_s,
                      decode_s=decode_s, speculative_rounds=tokens // 4)
    return [receipt] * MIN_RUNS


def _gate_on_recorded(world: World, tmp_path: Path, candidate: tuple[float, float], incumbent: tuple[float, float]):
    """`rollout advance` on evidence the bench's own verdict built from recorded (decode, request-wide) figures."""
    fleet = world.root / "fleet.toml"
    assert run("rollout", "plan", fleet, "--profile", world.root / "profiles" / "guarded.toml",
               "--canary", "ws-3").exit_code == 0
    candidate_digest, incumbent_digest = _pair(world, "ws-3/hybrid")
    result = harness.shape_result(build_shape("echo"), {"candidate": _recorded(*candidate),
                                                      "baseline": _recorded(*incumbent)})
    identity = harness.shape_result(build_shape("identity"), {"candidate": _recorded(*candidate),
                                                            "baseline": _recorded(*incumbent)})
    path = evidence(tmp_path / "recorded.json", candidate_digest, incumbent_digest,
                    results={"echo": result, "identity": identity})
    return result, run("rollout", "advance", fleet, "--evidence", path)


def test_a_drafter_fast_on_decode_is_gated_on_what_a_request_gains(world: World, tmp_path: Path) -> None:
    """The recorded DSpark case: 169.324 against 32.249 tok/s decode (5.25x), 32.678 against 22.618 request-wide at
    ctx 1024 (1.445x). It opens the stage, and the operator reads the request-wide 1.445x beside the 5.25x."""
    result, opened = _gate_on_recorded(world, tmp_path, (169.324, 32.678), (32.249, 22.618))
    assert result["verdict"] == "faster" and result["judged"] == {"decode": "faster", "request-wide": "faster"}
    assert result["speedup"] == pytest.approx(5.250,
                                              abs=1e-3) and result["request_speedup"] == pytest.approx(1.445, abs=1e-3)
    assert opened.exit_code == 0, opened.output
    assert "decode faster: 169.32 vs the incumbent's 32.25 tok/s (5.251x)" in opened.output
    assert "request-wide faster: 32.68 vs the incumbent's 22.62 tok/s (1.445x)" in opened.output


def test_a_profile_that_wins_decode_and_loses_request_wide_is_refused_naming_request_wide(
        world: World, tmp_path: Path) -> None:
    """The recorded FR peak: 174.413 against 147.021 tok/s steady decode, but 37.290 against 47.032 request-wide."""
    result, refused = _gate_on_recorded(world, tmp_path, (174.413, 37.290), (147.021, 47.032))
    assert result["verdict"] == "slower" and result["judged"] == {"decode": "faster", "request-wide": "slower"}
    assert "slower on request-wide" in result["verdict_reason"]
    assert refused.exit_code == 1 and "PWR073" in refused.output
    assert "the bench's verdict is 'slower': not faster on request-wide" in " ".join(refused.output.split())
    assert _lock(world).rollout["next_stage"] == 0 and "refused: stage canary stays closed" in refused.output


@pytest.mark.parametrize(("policy", "opens"), [("", False), ('exactness = "near-tie"\nnear_tie_margin = 0.05\n', True),
                                               ('exactness = "near-tie"\nnear_tie_margin = 0.01\n', False)])
def test_near_tie_divergences_open_a_stage_only_where_the_deployment_accepts_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str, opens: bool) -> None:
    """A live engine's greedy outputs part where the target's top two tokens are 0.02 nats apart: the default gate
    (exact) refuses, a deployment that states `exactness = "near-tie"` with a wider margin accepts."""
    monkeypatch.setenv("POWER_CACHE_DIR", str(tmp_path / "cache"))
    world = build_world(tmp_path / "world")
    fleet = world.fleet(HOSTS, DEPLOYMENTS.replace('traffic = "echo"', f'traffic = "echo"\n{policy}'))
    assert run("fleet", "review", fleet, "--write-lock").exit_code == 0
    assert run("rollout", "plan", fleet, "--profile", world.root / "profiles" / "guarded.toml",
               "--canary", "ws-3").exit_code == 0
    candidate_digest, incumbent_digest = _pair(world, "ws-3/hybrid")
    tie = {"run": 0, "position": 5, "baseline_token": 7, "candidate_token": 8, "baseline_logprob": -0.69,
           "candidate_logprob": -0.71, "margin": 0.02, "target_top_token": 7}
    differing = [replace(receipt, token_ids=[*receipt.token_ids[:5], 8, *receipt.token_ids[6:]])
                 for receipt in _recorded(60.0, 30.0)]
    results = {"echo": harness.shape_result(build_shape("echo"), {"candidate": differing,
                                                                "baseline": _recorded(20.0, 15.0)}, [tie] * MIN_RUNS),
               "identity": harness.shape_result(build_shape("identity"), {"candidate": _recorded(60.0, 30.0),
                                                                        "baseline": _recorded(20.0, 15.0)})}
    assert results["echo"]["exactness"] == "near-tie"
    path = evidence(tmp_path / "near-tie.json", candidate_digest, incumbent_digest, results=results)
    result = run("rollout", "advance", fleet, "--evidence", path)
    assert (result.exit_code == 0) == opens, result.output
    if not opens:
        assert "PWR072" in result.output and "the bench calls it near-tie" in " ".join(result.output.split())


@pytest.mark.parametrize(("under_load", "opens"), [(None, False), ({1: 1.4, 4: 0.9}, False), ({1: 1.4, 4: 1.2}, True)])
def test_a_deployment_serving_clients_at_once_is_gated_at_that_load(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, under_load: dict | None, opens: bool) -> None:
    """Single-stream evidence says nothing about four clients at once: the gate reads the --concurrency level."""
    monkeypatch.setenv("POWER_CACHE_DIR", str(tmp_path / "cache"))
    world = build_world(tmp_path / "world")
    fleet = world.fleet(HOSTS, DEPLOYMENTS.replace('traffic = "echo"', 'traffic = "echo"\nconcurrency = 4'))
    assert run("fleet", "review", fleet, "--write-lock").exit_code == 0
    assert run("rollout", "plan", fleet, "--profile", world.root / "profiles" / "guarded.toml",
               "--canary", "ws-3").exit_code == 0
    candidate, incumbent = _pair(world, "ws-3/hybrid")
    path = evidence(tmp_path / "load.json", candidate, incumbent, under_load=under_load)
    result = run("rollout", "advance", fleet, "--evidence", path)
    assert (result.exit_code == 0) == opens, result.output
    said = " ".join(result.output.split())
    if under_load is None:
        assert "no measurement at 4" in said and "--concurrency 1,4" in said
    elif not opens:
        assert "at 4 clients at once" in said and "0.900x" in said
