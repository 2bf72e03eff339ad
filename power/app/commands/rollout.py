"""`power rollout plan|status|advance|rollback FLEET`: stage a profile across a fleet, gated by bench evidence.

Exit codes: 0 done; 1 refused (findings say which evidence is missing or which
gate failed; the lock is unchanged); 2 usage or input error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

import click

from power.app.cli import EXIT_FINDINGS, EXIT_OK
from power.app.outputs import require_outputs
from power.documents.plan import ResolvedPlan, save_plan
from power.orchestrator.fleet.kubernetes import render_fleet
from power.orchestrator.fleet.review import default_lock_path
from power.orchestrator.fleet.rollout import Outcome, advance, open_lock, plan_rollout, rollback, rollout_status
from power.orchestrator.kubernetes.tree import write_tree
from power.orchestrator.planning.plan_memo import PlanMemo

_FLEET = click.argument("fleet_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
_LOCK = click.option("--lock", "lock_path", type=click.Path(path_type=Path),
                     help="The fleet lock holding the rollout state (default: fleet.lock beside FLEET).")
_JSON = click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
_KUBERNETES = click.option("--kubernetes", type=click.Path(path_type=Path, file_okay=False),
                           help="The folder `power fleet render --target kubernetes` wrote: rewrite it with an "
                                "overlay per applied stage.")


@click.group()
def rollout() -> None:
    """Stage a profile across a fleet (canary -> waves -> all), gated by evidence receipts."""


@rollout.command("plan")
@_FLEET
@click.option("--profile", "profile_path", type=click.Path(path_type=Path, exists=True, dir_okay=False), required=True,
              help="The profile to roll out.")
@click.option("--canary", multiple=True, help="A canary host (repeatable; default: hosts labelled "
                                              "rollout=\"canary\", else the first).")
@click.option("--waves", type=click.IntRange(1, 100), default=2, show_default=True, help="Stages after the canary.")
@click.option("--deployments", "select", default="*", show_default=True,
              help="Only deployments whose key (host/name) matches this glob, e.g. '*/qwen3.6-27b-q6k'.")
@_LOCK
@_JSON
def plan_command(fleet_file: Path, profile_path: Path, canary: tuple[str, ...], waves: int, select: str,
                 lock_path: Path | None, as_json: bool) -> None:
    """Compile the selected deployments with PROFILE and stage the hosts whose plan changes."""
    _require_lock(fleet_file, lock_path, as_json)
    _finish(plan_rollout(fleet_file, profile_path, lock_path, list(canary), waves, select), as_json)


@rollout.command()
@_FLEET
@_LOCK
@_JSON
@click.option("--export-plans", type=click.Path(path_type=Path, file_okay=False),
              help="Write every plan the lock holds to DIR/<digest[:12]>.json, ready for `power bench`.")
def status(fleet_file: Path, lock_path: Path | None, as_json: bool, export_plans: Path | None) -> None:
    """Show the stages, which are applied, and the evidence the next one needs."""
    require_outputs(directories=(export_plans,), as_json=as_json)
    outcome = rollout_status(fleet_file, lock_path)
    if export_plans is not None and outcome.ok:
        _export_plans(fleet_file, lock_path, export_plans, outcome)
    _finish(outcome, as_json)


@rollout.command("advance")
@_FLEET
@click.option("--evidence", "evidence_paths", multiple=True, type=click.Path(path_type=Path),
              help="An evidence file from `power bench` (repeatable).")
@_LOCK
@_JSON
@_KUBERNETES
def advance_command(fleet_file: Path, evidence_paths: tuple[Path, ...], lock_path: Path | None, as_json: bool,
                    kubernetes: Path | None) -> None:
    """Apply the next stage, if the evidence opens its gate; otherwise say what is missing.

    With --kubernetes DIR, the stage's overlay is written too (DIR/stages/<stage>: `kubectl apply -k` it).
    """
    _require_lock(fleet_file, lock_path, as_json, kubernetes)
    _finish(_with_tree(fleet_file, lock_path, kubernetes, lambda: advance(fleet_file, list(evidence_paths), lock_path)),
            as_json)


@rollout.command("rollback")
@_FLEET
@_LOCK
@_JSON
@_KUBERNETES
def rollback_command(fleet_file: Path, lock_path: Path | None, as_json: bool, kubernetes: Path | None) -> None:
    """Restore every deployment the rollout changed to its previous plan.

    With --kubernetes DIR, the stage overlays are removed (`kubectl apply -k DIR/base` restores the cluster).
    """
    _require_lock(fleet_file, lock_path, as_json, kubernetes)
    _finish(_with_tree(fleet_file, lock_path, kubernetes, lambda: rollback(fleet_file, lock_path)), as_json)


def _require_lock(fleet_file: Path, lock_path: Path | None, as_json: bool, tree: Path | None = None) -> None:
    """The lock these commands write (and the Kubernetes tree) must be writable before the fleet is reviewed."""
    require_outputs(files=(lock_path or default_lock_path(fleet_file),), trees=(tree,), as_json=as_json)


def _with_tree(fleet_file: Path, lock_path: Path | None, directory: Path | None,
               command: Callable[[], Outcome]) -> Outcome:
    """Run a rollout command; with a Kubernetes folder, render the tree before (refusing to touch the lock when it
    cannot render) and write it after the lock changed."""
    if directory is None:
        return command()
    memo = PlanMemo()
    files, findings = render_fleet(fleet_file, lock_path, memo=memo)
    if files is None:
        return Outcome(findings=findings, lines=[f"refused: {directory} cannot be rendered; the lock is unchanged"])
    outcome = command()
    if not outcome.ok:
        return outcome
    files, findings = render_fleet(fleet_file, lock_path, memo=memo)
    outcome.findings += findings
    if files is not None:
        write_tree(directory, files)
        stages = sorted({path.split("/")[1] for path in files if path.startswith("stages/")})
        outcome.lines.append(
            f"wrote {directory}: " + (f"stages {', '.join(stages)} over base" if stages else "base only")
        )
    return outcome


def _export_plans(fleet_file: Path, lock_path: Path | None, directory: Path, outcome: Outcome) -> None:
    _, lock, opened = open_lock(fleet_file, lock_path)
    if lock is None:
        outcome.findings += opened.findings
        return
    directory.mkdir(parents=True, exist_ok=True)
    for digest, document in lock.plans.items():
        save_plan(ResolvedPlan.model_validate(document), directory / f"{digest[:12]}.json")
    outcome.lines.append(f"exported {len(lock.plans)} plan(s) to {directory}")


def _finish(outcome: Outcome, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(outcome.to_json(), indent=2))
    else:
        for finding in outcome.findings:
            click.echo(finding.render(), err=finding.is_error)
        for line in outcome.lines:
            click.echo(line)
    sys.exit(EXIT_OK if outcome.ok else EXIT_FINDINGS)
