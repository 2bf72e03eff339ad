"""`power verify PLAN [--root DIR] [--json]`: the last gate before an engine starts.

Checks, in order: the plan's seal (its digest over its content); every artifact it
names, hashed in full (never from the digest cache) against the planned size and
sha256; each drafter's binding (its `target_sha256` is the target's); what the plan's
engine would refuse in the target's header (`power.artifacts.header_values`, and for
Power's runtime a tensor type it cannot read); each drafter's tokenizer against the
target's, over the complete vocabulary. One finding per problem. Exit codes: 0
everything holds; 1 a check failed (a broken seal, a missing or changed artifact, a
binding or tokenizer mismatch, a target the engine cannot load); 2 usage error or a
file that is not a readable plan. Imports no torch, so an init container starts it in a
moment.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NoReturn

import click

from power.app.cli import EXIT_FINDINGS, EXIT_OK, print_findings, refuse
from power.app.commands.artifact_root import root_option
from power.artifacts.checkpoint import read_checkpoint
from power.artifacts.facts import ArtifactError, inspect_artifact
from power.artifacts.verify import Artifact, verified_sha256
from power.documents.plan import PlanError, ResolvedPlan, load_plan, located, planned_artifacts
from power.findings import Finding, Severity, has_errors
from power.orchestrator.engines import adapter
from power.orchestrator.planning.checks.artifacts import Checked
from power.orchestrator.planning.checks.checkpoints import tokenizer_findings
from power.orchestrator.planning.checks.tokenizer import check_tokenizer

BROKEN_SEAL = "PWR082"


@click.command("verify")
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path))
@root_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: the plan, each artifact, the findings.")
def verify(plan_path: Path, root: Path | None, as_json: bool) -> None:
    """Verify a PLAN before it runs: its seal, every artifact by full sha256, drafter bindings and tokenizers.

    Exit codes: 0 all holds, 1 a check failed, 2 usage error or an unreadable plan.
    """
    try:
        plan = located(load_plan(plan_path), plan_path, root)
    except PlanError as err:
        if err.finding.code != BROKEN_SEAL:
            refuse(err, as_json)
        _report(plan_path, None, [], [err.finding], as_json)
    verified, findings = _artifacts(plan)
    if not has_errors(findings):
        findings += _bindings(plan) + _runnable(plan)
    if not has_errors(findings):
        findings += _tokenizers(plan)
    _report(plan_path, plan, verified, findings, as_json)


def _artifacts(plan: ResolvedPlan) -> tuple[list[Artifact], list[Finding]]:
    """The artifacts that are the planned files, and a finding for each that is not."""
    verified, findings = [], []
    for artifact in planned_artifacts(plan):
        try:
            verified_sha256(artifact)
        except ArtifactError as err:
            findings.append(err.finding)
        else:
            verified.append(artifact)
    return verified, findings


def _bindings(plan: ResolvedPlan) -> list[Finding]:
    return [Finding("PWR213", Severity.ERROR, f"drafters[{index}] ({drafter.kind}) is bound to target sha256 "
                    f"{drafter.target_sha256[:16]}..., but the plan's target is {plan.target.sha256[:16]}...",
                    file=drafter.path, where=f"drafters[{index}].target_sha256",
                    hint="use the drafter built for this target, and re-plan")
            for index, drafter in enumerate(plan.drafters)
            if drafter.target_sha256 is not None and drafter.target_sha256 != plan.target.sha256]


def _runnable(plan: ResolvedPlan) -> list[Finding]:
    """What the plan's engine would refuse in the target's header, refused here first: a header value or tensor
    shape no model has (`power.artifacts.header_values`), and for Power's runtime a tensor type it cannot read, in
    the target and in each GGUF drafter."""
    engine = adapter(plan.memory.engine)
    try:
        target = inspect_artifact(plan.target.path)
        drafters = [inspect_artifact(d.path) for d in plan.drafters if d.path is not None and d.files is None]
    except ArtifactError as err:
        return [err.finding]
    return ([finding for finding in target.findings if finding.is_error]
            + [finding for facts in (target, *drafters) for finding in engine.artifact_findings(facts)])


def _tokenizers(plan: ResolvedPlan) -> list[Finding]:
    """Each drafter file's tokenizer against the target's (`power.orchestrator.planning.checks.tokenizer`)."""
    try:
        target = Checked(inspect_artifact(plan.target.path), plan.target.sha256)
        findings = []
        for index, drafter in enumerate(plan.drafters):
            if drafter.files is not None:
                checkpoint = read_checkpoint(Path(drafter.path or ""), [f.name for f in drafter.files])
                findings += tokenizer_findings(index, drafter.kind, checkpoint, target.facts.tokenizer)
            elif drafter.path is not None:
                own = Checked(inspect_artifact(drafter.path), drafter.sha256)
                findings += check_tokenizer(index, drafter.kind, own, target)
        return findings
    except ArtifactError as err:
        return [err.finding]


def _report(plan_path: Path, plan: ResolvedPlan | None, verified: list[Artifact], findings: list[Finding],
            as_json: bool) -> NoReturn:
    ok = not has_errors(findings)
    if as_json:
        artifacts = planned_artifacts(plan) if plan is not None else ()
        click.echo(json.dumps({
            "plan": str(plan_path), "digest": plan.digest if plan is not None else None, "verified": ok,
            "artifacts": [{"role": a.role, "path": str(a.path), "size": a.size, "sha256": a.sha256,
                           "source": a.source, "verified": a in verified} for a in artifacts],
            "findings": [f.to_json() for f in findings]}, indent=2))
    else:
        for artifact in verified:
            source = f", from {artifact.source}" if artifact.source is not None else ""
            click.echo(f"ok  {artifact.label}: {artifact.path} (sha256 {artifact.sha256}{source})")
    print_findings(findings, as_json=False)
    digest = f" (plan digest {plan.digest})" if plan is not None else ""
    click.echo(f"{plan_path}: {'verified' if ok else 'NOT verified'}{digest}", err=True)
    sys.exit(EXIT_OK if ok else EXIT_FINDINGS)
