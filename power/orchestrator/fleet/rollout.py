"""Profile rollout: canary -> waves -> all, each stage gated by `power bench` evidence; state in the fleet lock.

`plan_rollout` compiles every deployment's plan with the new profile (the
candidates) against what runs now (the incumbents: the lock's records, or the
reviewed plans when the lock has none) and stages the hosts whose plan
changes. `advance` applies the next stage only when, for every
(candidate, incumbent) pair in it, an evidence file (docs/bench.md) shows:
greedy losslessness proven; on every traffic shape those deployments serve,
identical outputs and the bench's verdict "faster" on decode and request-wide
tok/s both (the paired runs' median ratio >= 1.05, the bound on it above 1); no fallbacks, and no replays unless the
candidate is the guarded K/S path (S < K: at most one exact replay per request); and measured on
the engine those deployments run (the fleet's `engine`: Power's runtime, or a live
llama-server / vLLM launched from the render): evidence from another engine is
refused at the deployment (PWR077). `rollback` restores every
record the rollout replaced. Each command either succeeds completely and
writes the lock once, atomically, or leaves the lock as it was.

The rollout state (`lock.rollout`):

    profile      the new profile's path (as given) and name
    status       "in-progress" | "complete" | "rolled-back"
    stages       [{name, keys}] in order: canary, wave-1.., all
    next_stage   index of the stage `advance` applies next
    candidates   {key: record} the plans being rolled out
    previous     {key: record} what the applied stages replaced
    evidence     {stage name: [sha256 of each evidence file that opened it]}
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from power.artifacts.bounded_reader import MAX_TOML_BYTES, DocumentError, read_bytes
from power.documents.verdicts import NOISE_BAND, pairs
from power.findings import Finding, Severity, has_errors
from power.orchestrator.fleet.evidence import Evidence, GatedShape, read_evidence
from power.orchestrator.fleet.lock import FleetLock, LockConflict, read_lock, write_lock
from power.orchestrator.fleet.review import (
    DeploymentReview,
    FleetReview,
    default_lock_path,
    fleet_name,
    plan_record,
    review_fleet,
)
from power.orchestrator.inputs.loading import Loaded, load_fleet, load_manifest
from power.orchestrator.inputs.schema import Fleet
from power.orchestrator.planning.plan_memo import PlanMemo

IN_PROGRESS, COMPLETE, ROLLED_BACK = "in-progress", "complete", "rolled-back"
# Fewer paired runs than this per shape give no bound on the median ratio: no speedup told from noise.
MIN_RUNS = 3
CANARY_LABEL = ("rollout", "canary")


@dataclass
class Outcome:
    """What a rollout command did: findings (errors mean nothing was written) and a human summary."""

    findings: list[Finding] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    state: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not has_errors(self.findings)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "summary": self.lines, "rollout": self.state,
                "findings": [f.to_json() for f in self.findings]}


def plan_rollout(fleet_path: Path, profile_path: Path, lock_path: Path | None = None,
                 canary: list[str] | None = None, waves: int = 2, select: str = "*") -> Outcome:
    """Stage `profile_path` across the deployments whose key (`host/name`) matches the `select` glob."""
    lock_path = Path(lock_path) if lock_path else default_lock_path(fleet_path)
    memo = PlanMemo()
    review = review_fleet(fleet_path, lock_path, memo)
    outcome = Outcome(findings=[f for f in review.all_findings if f.severity is Severity.ERROR])
    lock, fleet = review.lock, review.fleet
    if not outcome.ok or lock is None or fleet is None:
        outcome.lines.append("refused: the fleet review has errors; fix them before rolling out a profile")
        return outcome
    if lock.rollout and lock.rollout["status"] == IN_PROGRESS:
        outcome.findings.append(_state_finding(lock_path, f"a rollout of {lock.rollout['profile']['name']} is in "
                                               "progress", "advance or roll it back first"))
        return outcome
    selected = [item for item in review.deployments if fnmatch.fnmatchcase(item.key, select)]
    if not selected:
        outcome.findings.append(_state_finding(fleet_path, f"no deployment key matches {select!r}",
                                               "keys are host/name, as `power fleet review` lists them"))
        return outcome
    candidates = _candidates(review, fleet, selected, Path(profile_path), memo, outcome)
    if not outcome.ok:
        return outcome
    incumbents = {key: lock.deployments.get(key) or record for key, record in review.records().items()}
    lock.deployments.update(incumbents)
    changing = [key for key in candidates if candidates[key]["plan_digest"] != incumbents[key]["plan_digest"]]
    if not changing:
        outcome.lines.append("nothing to roll out: every deployment already runs these plans")
        return outcome
    stages = _stages(fleet, changing, canary or [], waves)
    _store_plans(lock, review, memo)
    profile_name = next(iter(candidates.values()))["profile"]
    lock.rollout = {
        "profile": {"path": str(Path(profile_path).resolve()), "name": profile_name},
        "status": IN_PROGRESS,
        "stages": stages,
        "next_stage": 0,
        "candidates": {key: candidates[key] for key in changing},
        "previous": {},
        "evidence": {},
    }
    if not _written(lock_path, lock, outcome):
        return outcome
    outcome.state = lock.rollout
    outcome.lines += [f"rollout of {profile_name}: {len(changing)} deployment(s) in {len(stages)} stage(s)"]
    outcome.lines += [f"  {stage['name']}: {', '.join(stage['keys'])}" for stage in stages]
    return outcome


def rollout_status(fleet_path: Path, lock_path: Path | None = None) -> Outcome:
    lock_path, lock, outcome = open_lock(fleet_path, lock_path)
    if lock is None:
        return outcome
    if not lock.rollout:
        outcome.lines.append("no rollout recorded in the lock")
        return outcome
    rollout = lock.rollout
    outcome.state = rollout
    outcome.lines.append(f"rollout of {rollout['profile']['name']}: {rollout['status']}")
    outcome.lines += [f"  {name:<8} {state:<12} {', '.join(keys)}" for name, state, keys in stage_states(rollout)]
    if rollout["status"] == IN_PROGRESS:
        outcome.lines.append("evidence the next stage needs (PLANS: `--export-plans PLANS`):")
        outcome.lines += [f"  {line}" for line in _requirement_lines(rollout, lock)]
    return outcome


def stage_states(rollout: dict[str, Any]) -> list[tuple[str, str, list[str]]]:
    """(stage name, applied | next | pending | rolled back | not applied, deployment keys) in stage order."""
    states = []
    for index, stage in enumerate(rollout["stages"]):
        done = index < rollout["next_stage"]
        if rollout["status"] == ROLLED_BACK:
            state = "rolled back" if done else "not applied"
        else:
            state = "applied" if done else "next" if index == rollout["next_stage"] else "pending"
        states.append((stage["name"], state, stage["keys"]))
    return states


def advance(fleet_path: Path, evidence_paths: list[Path], lock_path: Path | None = None) -> Outcome:
    lock_path, lock, outcome = open_lock(fleet_path, lock_path)
    if lock is None:
        return outcome
    rollout = lock.rollout
    if not rollout or rollout["status"] != IN_PROGRESS:
        outcome.findings.append(_state_finding(lock_path, "no rollout is in progress",
                                               "start one with `power rollout plan FLEET --profile P`"))
        return outcome
    outcome.findings += _profile_changed(rollout, lock)
    evidence = _read_all(evidence_paths, outcome)
    stage = rollout["stages"][rollout["next_stage"]]
    used = []
    for pair, keys in _pairs(rollout, stage, lock).items():
        shapes = sorted({rollout["candidates"][key]["traffic"] for key in keys})
        found = evidence.get(pair, [])
        if not found:
            engines = sorted({_engine(rollout["candidates"][key]) for key in keys})
            outcome.findings.append(_missing(lock_path, stage["name"], pair, keys, shapes, engines))
            continue
        measured_on: dict[str, Evidence] = {}
        for measured in found:  # the first file given for each engine
            measured_on.setdefault(measured.engine, measured)
        for engine in sorted({_engine(rollout["candidates"][key]) for key in keys}):
            serving = [key for key in keys if _engine(rollout["candidates"][key]) == engine]
            item = measured_on.get(engine)
            if item is None:
                outcome.findings += [_other_engine(fleet_path, key, engine, found) for key in serving]
                continue
            used.append(item.sha256)
            record = rollout["candidates"][serving[0]]
            outcome.findings += gate(item, shapes, record["rollback"], Exactness.of(record),
                                     record.get("concurrency", 1))
            outcome.lines += [f"{', '.join(serving)} on {shape!r} ({engine}): {_figures(item.shapes[shape])}"
                              for shape in shapes if shape in item.shapes]
    if not outcome.ok:
        outcome.lines.append(f"refused: stage {stage['name']} stays closed; the lock is unchanged")
        return outcome
    for key in stage["keys"]:
        rollout["previous"].setdefault(key, lock.deployments[key])
        lock.deployments[key] = rollout["candidates"][key]
    rollout["evidence"][stage["name"]] = sorted(set(used))
    rollout["next_stage"] += 1
    if rollout["next_stage"] == len(rollout["stages"]):
        rollout["status"] = COMPLETE
    if not _written(lock_path, lock, outcome):
        return outcome
    outcome.state = rollout
    outcome.lines.append(f"stage {stage['name']} applied to {', '.join(stage['keys'])}; rollout {rollout['status']}")
    return outcome


def rollback(fleet_path: Path, lock_path: Path | None = None) -> Outcome:
    lock_path, lock, outcome = open_lock(fleet_path, lock_path)
    if lock is None:
        return outcome
    rollout = lock.rollout
    if not rollout or rollout["status"] == ROLLED_BACK:
        outcome.findings.append(_state_finding(lock_path, "there is no rollout to roll back",
                                               "`power rollout status FLEET` shows what the lock records"))
        return outcome
    restored = sorted(rollout["previous"])
    for key in restored:
        lock.deployments[key] = rollout["previous"][key]
    rollout["status"] = ROLLED_BACK
    if not _written(lock_path, lock, outcome):
        return outcome
    outcome.state = rollout
    outcome.lines.append(f"rolled back {rollout['profile']['name']}: restored "
                         f"{', '.join(restored) if restored else 'nothing (no stage had been applied)'}")
    return outcome


def _written(lock_path: Path, lock: FleetLock, outcome: Outcome) -> bool:
    try:
        write_lock(lock_path, lock)
    except LockConflict as conflict:
        outcome.findings.append(conflict.finding)
        return False
    return True


@dataclass(frozen=True)
class Exactness:
    """What the deployments' gate accepts of greedy outputs (the fleet's `exactness` and `near_tie_margin`)."""

    policy: str = "exact"  # exact | near-tie
    margin: float = 0.0

    @classmethod
    def of(cls, record: dict[str, Any]) -> Exactness:
        written = record.get("exactness")
        return cls(written["policy"], float(written["margin"])) if written else cls()

    def accepts(self, result: GatedShape) -> bool:
        """Identical outputs; or, under near-tie, divergences each within this policy's margin (the evidence's own
        margins, not its class)."""
        return result.parity or (self.policy == "near-tie" and bool(result.margins) and all(
            margin is not None and margin <= self.margin for margin in result.margins))


def gate(evidence: Evidence, shapes: list[str], rollback_policy: str, exactness: Exactness | None = None,
         clients: int = 1) -> list[Finding]:
    """Every reason this evidence does not open the stage for deployments serving `shapes` to `clients` at once
    (empty: it does)."""
    exactness = exactness or Exactness()
    findings = _under_load(evidence, shapes, clients)
    proven = evidence.lossless or (exactness.policy == "near-tie" and evidence.lossless_to_near_ties)
    if not proven:
        findings.append(_gate_finding("PWR072", evidence, "greedy losslessness is not proven (outputs differ or "
                                      "were not compared)", "speculation may only buy speed: find the divergence "
                                      "with `power bench` before rolling out"))
    for shape in shapes:
        result = evidence.shapes.get(shape)
        if result is None:
            findings.append(_gate_finding("PWR073", evidence, f"no measurement on the {shape!r} traffic these "
                                          "deployments serve", f"rerun the bench with --shapes including {shape}"))
            continue
        if not exactness.accepts(result):
            findings.append(_gate_finding("PWR072", evidence, f"on {shape!r} the greedy outputs differ between the "
                                          f"candidate and the incumbent ({_divergence(result, exactness)})",
                                          "a lossy plan never rolls out: find the divergence before anything else; "
                                          "a live engine's near-ties are accepted only where the deployment says "
                                          "exactness = \"near-tie\""))
        if result.requests < MIN_RUNS:
            findings.append(_gate_finding(
                "PWR073", evidence, f"on {shape!r} only {result.requests} measured run(s) per configuration: too few "
                "to tell a speedup from noise", f"rerun the bench with --runs {MIN_RUNS} or more"))
        elif result.verdict != "faster":
            findings.append(_gate_finding(
                "PWR073", evidence, f"on {shape!r} the bench's verdict is {result.verdict!r}: {_figures(result)}; a "
                f"stage needs 'faster' on decode and request-wide both (the paired runs' median ratio >= "
                f"{1 + NOISE_BAND:.2f}x, the bound on it above 1)",
                _not_faster_hint(result)))
        elif untrusted := _untrusted(result):
            findings.append(_gate_finding(
                "PWR073", evidence, f"on {shape!r} the evidence says 'faster' but {untrusted}: the gate trusts the "
                f"runs, which need >= {1 + NOISE_BAND:.2f}x with the bound above 1 on decode and request-wide",
                "rerun `power bench`; "
                "evidence is never edited by hand"))
        allowed_replays = result.requests if rollback_policy == "guarded" else 0
        if result.fallbacks > 0 or result.replays > allowed_replays:
            findings.append(_gate_finding(
                "PWR074", evidence, f"on {shape!r}: {result.replays} replays, {result.fallbacks} fallbacks "
                f"(expected: at most {allowed_replays} replays for a {rollback_policy} K/S plan, no fallbacks)",
                "replays beyond the guarded path or fallbacks mean the plan does not hold as compiled"))
    return findings


def _under_load(evidence: Evidence, shapes: list[str], clients: int) -> list[Finding]:
    """A deployment serving several clients at once is judged there: the candidate's aggregate must pay at that
    level (`power bench --concurrency`) on every shape it serves."""
    if clients == 1:
        return []
    measured = (evidence.under_load or {}).get(clients)
    if measured is None:
        return [_gate_finding("PWR073", evidence, f"the deployments serve {clients} clients at once, and the evidence "
                              f"has no measurement at {clients}", f"rerun the bench with --concurrency 1,{clients}")]
    findings = []
    for shape in shapes:
        speedup = measured.get(shape)
        if speedup is None or speedup < 1 + NOISE_BAND:
            shown = "no baseline rate" if speedup is None else f"{speedup:.3f}x the incumbent's aggregate tok/s"
            findings.append(_gate_finding(
                "PWR073", evidence, f"on {shape!r} at {clients} clients at once (what the deployments serve) the "
                f"candidate gives {shown}; a stage needs >= {1 + NOISE_BAND:.2f}x there",
                "keep the incumbent for this load, or a shallower draft that still pays with full slots"))
    return findings


def _divergence(result: GatedShape, exactness: Exactness) -> str:
    told = [m for m in result.margins if m is not None]
    widest = f"the widest {max(told):.4f} nats" if told else "none of them told by the target's probabilities"
    margins = f"{len(result.margins)} divergence(s) explained, {widest}" if result.margins else "unexplained"
    policy = ("the deployment accepts exact outputs only" if exactness.policy == "exact"
              else f"the deployment accepts near-ties within {exactness.margin} nats")
    return f"the bench calls it {result.exactness}: {margins}; {policy}"


def _rates(result: GatedShape) -> dict[str, tuple[float, float, float]]:
    """Each judged figure's (candidate tok/s, incumbent tok/s, stated speedup)."""
    return {"decode": (result.candidate_tok_s, result.baseline_tok_s, result.speedup),
            "request-wide": (result.request_candidate_tok_s, result.request_baseline_tok_s, result.request_speedup)}


def _figures(result: GatedShape) -> str:
    """Both figures and their verdicts, the ones that were not faster named first."""
    failed = [figure for figure in _rates(result) if result.judged.get(figure) != "faster"]
    rates = "; ".join(f"{figure} {result.judged.get(figure, 'not judged')}: {candidate:.2f} vs the incumbent's "
                      f"{baseline:.2f} tok/s ({speedup:.3f}x)"
                      for figure, (candidate, baseline, speedup) in _rates(result).items())
    return f"not faster on {' and '.join(failed)} ({rates})" if failed else rates


def _not_faster_hint(result: GatedShape) -> str:
    """What to do, by the cause: a median clear of the noise band whose pairs disagree (the bound on it reaches 1)
    is a measurement too noisy to call, not a plan to tune; a median inside the band (or below it) is the plan's."""
    medians = [speedup for figure, (_, _, speedup) in _rates(result).items() if result.judged.get(figure) != "faster"]
    if result.verdict == "no difference" and medians and all(m >= 1 + NOISE_BAND for m in medians):
        return (f"the medians are a clear win ({', '.join(f'{m:.2f}x' for m in medians)}) but the pairs disagree "
                "(the bound on the median ratio is not above 1): measure again with more runs (--runs 6 or more) or "
                "on a quieter host")
    return "keep the incumbent for this traffic, or tune K/S for it and measure again"


def _untrusted(result: GatedShape) -> str | None:
    """Where the evidence's own paired runs do not give the speedup it states, or no 'faster' verdict."""
    for figure, (candidate, baseline) in result.runs.items():
        stated = _rates(result)[figure][2]
        own = pairs(candidate, baseline)
        if own.verdict != "faster" or not math.isclose(own.median, stated, rel_tol=1e-3):
            return (f"its own {figure} runs give {own.median:.3f}x ({own.describe()}), and it states "
                    f"{stated:.3f}x")
    return None


def _candidates(review: FleetReview, fleet: Fleet, selected: list[DeploymentReview], profile_path: Path,
                memo: PlanMemo, outcome: Outcome) -> dict[str, dict[str, Any]]:
    profile = memo.profile(profile_path)
    outcome.findings += [f for f in profile.findings if f.severity is Severity.ERROR]
    if not profile.ok:
        return {}
    hosts = {host.name: host for host in fleet.hosts}
    candidates = {}
    for item in selected:
        manifest = memo.manifest(item.deployment.manifest)
        plan, findings = memo.plan(manifest, profile, hosts[item.deployment.host], item.deployment.device_indices,
                                   item.deployment.runs_on)
        outcome.findings += [f for f in findings if f.severity is Severity.ERROR]
        if plan is not None:
            memo.keep(plan)
            candidates[item.key] = plan_record(plan, item.deployment, profile.model.name,
                                               review.objects_digest(item.key, plan))
    return candidates


def _stages(fleet: Fleet, keys: list[str], canary: list[str], waves: int) -> list[dict[str, Any]]:
    order = [host.name for host in fleet.hosts]
    host_of = {key: key.split("/", 1)[0] for key in keys}
    hosts = [name for name in order if name in host_of.values()]
    labelled = [h.name for h in fleet.hosts if h.labels.get(CANARY_LABEL[0]) == CANARY_LABEL[1]]
    canary_hosts = [h for h in hosts if h in (canary or labelled)] or hosts[:1]
    rest = [h for h in hosts if h not in canary_hosts]
    groups = [("canary", canary_hosts)]
    size = max(1, -(-len(rest) // max(waves, 1)))
    chunks = [rest[i:i + size] for i in range(0, len(rest), size)]
    groups += [(f"wave-{n}", chunk) for n, chunk in enumerate(chunks[:-1], start=1)]
    if chunks:
        groups.append(("all", chunks[-1]))
    return [{"name": name, "keys": [k for k in keys if host_of[k] in members]} for name, members in groups]


def _store_plans(lock: FleetLock, review: FleetReview, memo: PlanMemo) -> None:
    for plan in list(review.plans().values()) + memo.kept():
        lock.plans.setdefault(plan.digest, plan.document())


def _pairs(rollout: dict[str, Any], stage: dict[str, Any], lock: FleetLock) -> dict[tuple[str, str], list[str]]:
    """Deployments of a stage grouped by (candidate digest, incumbent digest): one evidence file serves each group."""
    pairs: dict[tuple[str, str], list[str]] = {}
    for key in stage["keys"]:
        pair = (rollout["candidates"][key]["plan_digest"], lock.deployments[key]["plan_digest"])
        pairs.setdefault(pair, []).append(key)
    return pairs


def _requirement_lines(rollout: dict[str, Any], lock: FleetLock) -> list[str]:
    """One line per (candidate, incumbent) pair of the next stage: its deployments, shapes and the bench to run."""
    stage = rollout["stages"][rollout["next_stage"]]
    lines = []
    for (candidate, incumbent), keys in _pairs(rollout, stage, lock).items():
        shapes = ",".join(sorted({rollout["candidates"][key]["traffic"] for key in keys}))
        engines = sorted({_engine(rollout["candidates"][key]) for key in keys})
        for engine in engines:
            lines.append(f"{', '.join(keys)}: power bench PLANS/{candidate[:12]}.json --vs PLANS/{incumbent[:12]}.json "
                         f"--shapes {shapes},identity --engine {engine} -o evidence.json")
    return lines


def _missing(lock_path: Path, stage: str, pair: tuple[str, str], keys: list[str], shapes: list[str],
             engines: list[str]) -> Finding:
    candidate, incumbent = pair
    return Finding(
        code="PWR070", severity=Severity.ERROR, file=str(lock_path),
        message=f"stage {stage}: no evidence comparing candidate plan {candidate[:12]} with incumbent "
                f"{incumbent[:12]} (deployments {', '.join(keys)}; traffic {', '.join(shapes)})",
        hint=f"export the plans with `power rollout status FLEET --export-plans DIR`, then run `power bench "
             f"DIR/{candidate[:12]}.json --vs DIR/{incumbent[:12]}.json --shapes {','.join(shapes)},identity "
             f"--engine {' | '.join(engines)} -o evidence.json` (one run per engine the stage's deployments run) "
             "and pass it with --evidence")


def _read_all(paths: list[Path], outcome: Outcome) -> dict[tuple[str, str], list[Evidence]]:
    found: dict[tuple[str, str], list[Evidence]] = {}
    for path in paths:
        evidence, finding = read_evidence(path)
        if finding is not None:
            outcome.findings.append(finding)
        if evidence is not None:
            found.setdefault((evidence.candidate_digest, evidence.baseline_digest), []).append(evidence)
    return found


def _engine(record: dict[str, Any]) -> str:
    """The engine a lock record's deployment runs (records written before engines were recorded ran Power's)."""
    return str(record.get("engine", "power"))


def _other_engine(fleet_path: Path, key: str, engine: str, found: list[Evidence]) -> Finding:
    """PWR077 at the deployment's `engine` line: evidence about another engine says nothing about this one."""
    measured = ", ".join(sorted({f"{e.engine} ({e.path.name})" for e in found}))
    message = (f"deployment {key} runs {engine}, but the evidence for its plans was measured on {measured}: "
               "another engine's speed and parity say nothing about this one")
    hint = f"run the bench on the deployment's engine: power bench ... --engine {engine}"
    fleet = load_fleet(fleet_path)
    index = _deployment_index(fleet, key)
    if index is None:
        return Finding(code="PWR077", severity=Severity.ERROR, message=message, file=str(fleet_path), hint=hint)
    raw = (fleet.data or {}).get("deployments", [])[index]
    where = f"deployments[{index}].engine" if "engine" in raw else f"deployments[{index}].host"
    return fleet.finding("PWR077", message, where=where, hint=hint)


def _deployment_index(fleet: Loaded, key: str) -> int | None:
    """Which `[[deployments]]` entry is `host/name` (an unnamed one is named after its manifest)."""
    if not fleet.ok:
        return None
    host, _, name = key.partition("/")
    for index, deployment in enumerate(fleet.model.deployments):
        if deployment.host != host:
            continue
        manifest = load_manifest(deployment.manifest) if deployment.name is None else None
        if (deployment.name or (manifest.model.name if manifest and manifest.ok else "")) == name:
            return index
    return None


def _profile_changed(rollout: dict[str, Any], lock: FleetLock) -> list[Finding]:
    """The profile file must be the one the candidates were compiled from."""
    path = Path(rollout["profile"]["path"])
    any_candidate = next(iter(rollout["candidates"].values()))
    compiled_from = lock.plans[any_candidate["plan_digest"]]["sources"]["profile"]["sha256"]
    try:
        now = hashlib.sha256(read_bytes(path, MAX_TOML_BYTES)).hexdigest()
    except DocumentError:
        now = None
    if now == compiled_from:
        return []
    return [Finding(code="PWR075", severity=Severity.ERROR, file=str(path),
                    message="the profile changed (or disappeared) since `power rollout plan` compiled the candidates",
                    hint="roll this rollout back and plan it again with the profile as it is now")]


def _gate_finding(code: str, evidence: Evidence, message: str, hint: str) -> Finding:
    return Finding(code=code, severity=Severity.ERROR, message=message, file=str(evidence.path), hint=hint)


def _state_finding(lock_path: Path, message: str, hint: str) -> Finding:
    return Finding(code="PWR076", severity=Severity.ERROR, message=message, file=str(lock_path), hint=hint)


def open_lock(fleet_path: Path, lock_path: Path | None) -> tuple[Path, FleetLock | None, Outcome]:
    """The fleet's lock (beside the fleet unless named) and an outcome carrying its findings (the fleet file's own,
    when it cannot be read: the lock is only ever opened as a fleet's)."""
    lock_path = Path(lock_path) if lock_path else default_lock_path(fleet_path)
    loaded = load_fleet(fleet_path)
    if not loaded.ok:
        return lock_path, None, Outcome(findings=list(loaded.findings))
    lock, findings = read_lock(lock_path, fleet_name(loaded.model, fleet_path))
    return lock_path, lock, Outcome(findings=findings)
