"""`power fleet render --target kubernetes`: the reviewed fleet as a kustomize base, each applied rollout stage as
an overlay over it.

The base holds every deployment with the plan the fleet file gives it. A
rollout recorded in the lock (in progress or complete, not rolled back) adds an
overlay for each stage `power rollout advance` applied, moving that stage's
deployments and every earlier stage's to their candidate plans. A staged
deployment whose fleet file already names the candidate needs no patch; one
that runs neither plan is refused (PWR095). Nothing is written unless the whole
tree renders (`write_tree` then replaces the output folder whole).
"""

from __future__ import annotations

from pathlib import Path

from power.documents.plan import ResolvedPlan
from power.findings import Finding, Severity, has_errors
from power.orchestrator.fleet.review import FleetReview, review_fleet
from power.orchestrator.fleet.rollout import ROLLED_BACK
from power.orchestrator.kubernetes.placement import fleet_placements
from power.orchestrator.kubernetes.tree import Stage, build_tree, tree_finding
from power.orchestrator.planning.plan_memo import PlanMemo


def render_fleet(fleet_path: Path, lock_path: Path | None = None, dry_run: bool = False,
                 memo: PlanMemo | None = None) -> tuple[dict[str, str] | None, list[Finding]]:
    """The whole tree as {relative path: text}, or None with the error findings that keep it from a cluster.

    `memo`: one shared by renders of the same files (before and after a rollout command) compiles each plan once.
    """
    review = review_fleet(fleet_path, lock_path, memo, images_required=not dry_run)
    findings = review.all_findings
    if review.fleet is not None and review.fleet.kubernetes is None and review.loaded is not None:
        findings += fleet_placements(review.loaded, review.fleet, [], not dry_run)[1]
    if has_errors(findings):
        return None, findings
    files, tree_findings = fleet_tree(review)
    findings += tree_findings
    return (None if has_errors(findings) else files), findings


def fleet_tree(review: FleetReview) -> tuple[dict[str, str], list[Finding]]:
    stages, findings = applied_stages(review)
    plans = {d.key: d.plan for d in review.deployments if d.key in review.placements and d.plan is not None}
    fleet_name = (review.fleet.name if review.fleet else None) or review.path.stem
    header = (f"Rendered by Power from {review.path.name} (fleet {fleet_name}); regenerate with "
              f"`power fleet render {review.path.name} --target kubernetes -o DIR`, never edit")
    return build_tree(plans, review.placements, stages, header), findings


def applied_stages(review: FleetReview) -> tuple[list[Stage], list[Finding]]:
    """An overlay per applied stage of the lock's rollout: cumulative candidates over the reviewed base."""
    lock = review.lock
    rollout = lock.rollout if lock else None
    if lock is None or not rollout or rollout["status"] == ROLLED_BACK:
        return [], []
    base = {d.key: d.plan.digest for d in review.deployments if d.plan and d.key in review.placements}
    stages: list[Stage] = []
    findings: list[Finding] = []
    moved: dict[str, ResolvedPlan] = {}
    for stage in rollout["stages"][:rollout["next_stage"]]:
        if not rollout.get("evidence", {}).get(stage["name"]):
            # `rollout advance` records the evidence that opened each stage; a lock that marks one applied without
            # it was edited (and re-sealed) by hand, and renders no stage at all.
            findings.append(Finding(code="PWR070", severity=Severity.ERROR, file=str(review.lock_path),
                                    message=f"stage {stage['name']} is marked applied in the lock, but no evidence "
                                            "opened it", hint="roll the rollout back and advance it again with "
                                                              "`power rollout advance --evidence FILE`"))
            return [], findings
        for key in stage["keys"]:
            candidate = rollout["candidates"][key]["plan_digest"]
            incumbent = rollout["previous"][key]["plan_digest"]
            if key not in base or base[key] == candidate:
                continue
            if base[key] != incumbent:
                findings.append(tree_finding(
                    f"stage {stage['name']}: {key} runs plan {base[key][:12]} in the fleet file, neither the rollout's "
                    f"incumbent {incumbent[:12]} nor its candidate {candidate[:12]}",
                    "finish or roll back the rollout before changing the deployment in the fleet file",
                    str(review.lock_path)))
                continue
            moved[key] = ResolvedPlan.model_validate(lock.plans[candidate])
        if moved:
            stages.append(Stage(stage["name"], dict(moved)))
    return stages, findings
