"""`power fleet review|report|render FLEET`: plan and check every deployment; show drift against the fleet lock;
render the fleet for a cluster.

Exit codes (for CI): 0 clean; 1 error findings (in the fleet file, a manifest,
a profile, an artifact, a plan or the lock); 2 usage error (a bad option, a
FLEET path that does not exist); with `--detailed-exitcode`, 3 when the review
is clean but the plans differ from the lock (drift), like
`terraform plan -detailed-exitcode`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import click

from power.app.cli import EXIT_FINDINGS, EXIT_OK
from power.app.outputs import require_outputs, writing
from power.artifacts.atomic import write_text_atomic
from power.findings import Finding, Severity
from power.orchestrator.fleet.kubernetes import render_fleet
from power.orchestrator.fleet.lock import FleetLock, LockConflict, write_lock
from power.orchestrator.fleet.review import DRIFT_EXIT, FleetReview, default_lock_path, exit_code, review_fleet
from power.orchestrator.fleet.rollout import IN_PROGRESS, stage_states
from power.orchestrator.inputs.units import format_size
from power.orchestrator.kubernetes.tree import write_tree

_COLUMNS = ("DEPLOYMENT", "DEV", "FITS", "MARGIN", "MODE", "K/S", "ROLLBACK", "TRAFFIC", "FINDINGS")
_LOCK_OPTION = click.option("--lock", "lock_path", type=click.Path(path_type=Path),
                            help="The fleet lock (default: fleet.lock beside FLEET).")


@click.group()
def fleet() -> None:
    """Review a fleet: plan every deployment, show drift against the lock."""


@fleet.command()
@click.argument("fleet_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@_LOCK_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the review as JSON.")
@click.option("--detailed-exitcode", is_flag=True, help="Exit 3 when the review is clean but the plans "
                                                        "drift from the lock.")
@click.option("--write-lock", "record", is_flag=True,
              help="Record the reviewed plans in the lock as applied (only when the review has no errors).")
def review(fleet_file: Path, lock_path: Path | None, as_json: bool, detailed_exitcode: bool, record: bool) -> None:
    """Plan and check every deployment of FLEET; show drift against the lock.

    Exit codes: 0 clean, 1 error findings, 2 usage error,
    3 (with --detailed-exitcode) clean but drifted from the lock.
    """
    if record:
        require_outputs(files=(lock_path or default_lock_path(fleet_file),), as_json=as_json)
    result = review_fleet(fleet_file, lock_path)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        _print_review(result)
    code = exit_code(result, detailed_exitcode)
    if record and _rollout_in_progress(result):
        refusal = Finding(code="PWR076", severity=Severity.ERROR, file=str(result.lock_path),
                          message="a rollout is in progress: --write-lock would overwrite the plans its applied "
                                  "stages recorded", hint="advance or roll back the rollout first")
        click.echo(refusal.render(), err=True)
        sys.exit(EXIT_FINDINGS)
    if record and code in (EXIT_OK, DRIFT_EXIT):
        try:
            _record_plans(result)
        except LockConflict as conflict:
            click.echo(conflict.finding.render(), err=True)
            sys.exit(EXIT_FINDINGS)
        click.echo(f"recorded {len(result.records())} plan(s) in {result.lock_path}", err=True)
        code = EXIT_OK
    elif record:
        click.echo(f"{result.lock_path} is unchanged: the review has errors", err=True)
    sys.exit(code)


@fleet.command()
@click.argument("fleet_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@_LOCK_OPTION
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="The HTML file to write.")
def report(fleet_file: Path, lock_path: Path | None, output: Path) -> None:
    """Write the fleet review as one self-contained HTML page (hosts, VRAM bars, findings, drift).

    Exit codes: 0 clean, 1 the review has error findings (the page is written, showing them), 2 usage error.
    """
    from power.orchestrator.fleet.report import render_report  # jinja2: not for `--help`

    require_outputs(files=(output,))
    result = review_fleet(fleet_file, lock_path)
    if result.input_error:
        for finding in result.findings:
            click.echo(finding.render(), err=True)
        sys.exit(exit_code(result, False))
    rollout = result.lock.rollout if result.lock else None
    with writing(output):
        write_text_atomic(output, render_report(result.to_json(), result.drift_text(), rollout))
    click.echo(f"wrote {output}")
    sys.exit(EXIT_FINDINGS if result.has_errors else EXIT_OK)


@fleet.command("render")
@click.argument("fleet_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--target", type=click.Choice(["kubernetes"]), required=True, expose_value=False, help="What to render.")
@click.option("-o", "--output", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="The folder to write (replaced whole): base/ and stages/<stage>/.")
@click.option("--dry-run", is_flag=True, help="Render without engine images: placeholders under dry-run.invalid "
                                              "that validate but never pull.")
@_LOCK_OPTION
def render(fleet_file: Path, output: Path, dry_run: bool, lock_path: Path | None) -> None:
    """Render FLEET as Kubernetes manifests: a kustomize base, and an overlay per applied rollout stage.

    Exit codes: 0 written, 1 error findings (nothing written), 2 usage error.
    """
    require_outputs(trees=(output,))
    files, findings = render_fleet(fleet_file, lock_path, dry_run)
    for finding in findings:
        click.echo(finding.render(), err=True)
    if files is None:
        click.echo(f"{output} is unchanged: the fleet has errors", err=True)
        sys.exit(EXIT_FINDINGS)
    write_tree(output, files)
    click.echo(f"wrote {output} (kubectl apply -k {output / 'base'})")


def _rollout_in_progress(result: FleetReview) -> bool:
    return bool(result.lock and result.lock.rollout and result.lock.rollout["status"] == IN_PROGRESS)


def _record_plans(result: FleetReview) -> None:
    lock = result.lock or FleetLock(result.name)
    lock.deployments = result.records()
    lock.plans = {digest: plan.document() for digest, plan in result.plans().items()} | lock.plans
    write_lock(result.lock_path, lock)


def _print_review(result: FleetReview) -> None:
    for finding in result.all_findings:
        click.echo(_relative(finding).render(), err=finding.is_error and result.input_error)
    if result.input_error:
        return
    document = result.to_json()
    for host in document["hosts"]:
        devices = ", ".join(f"{d['model']} {format_size(d['vram_bytes'])}" for d in host["devices"])
        click.echo(f"\n{host['name']} ({devices}; headroom {format_size(host['headroom_bytes'])})")
        rows = [_row(item) for item in host["deployments"]] or [("(no deployments)",) + ("",) * (len(_COLUMNS) - 1)]
        click.echo(_table(rows))
    if result.lock is not None and result.lock.rollout:
        rollout = result.lock.rollout
        stages = ", ".join(f"{name} {state}" for name, state, _ in stage_states(rollout))
        click.echo(f"\nRollout of {rollout['profile']['name']}: {rollout['status']} ({stages})")
    if result.lock is not None:
        click.echo(f"\nDrift against {result.lock_path}:")
        click.echo(result.drift_text())
    summary = document["summary"]
    click.echo(f"\n{summary['hosts']} hosts, {summary['deployments']} deployments: "
               f"{summary['errors']} error{'s' * (summary['errors'] != 1)}, "
               f"{summary['warnings']} warning{'s' * (summary['warnings'] != 1)}")


def _relative(finding: Finding) -> Finding:
    """The finding with its file named as the fleet file is, relative to the current folder when it lies in it: the
    review reaches manifests and profiles by their resolved paths, and one listing should not mix the two forms."""
    if finding.file is None or not os.path.isabs(finding.file):
        return finding
    shown = os.path.relpath(finding.file)
    return finding if shown.startswith("..") else dataclasses.replace(finding, file=shown)


def _row(item: dict) -> tuple[str, ...]:
    margin = item["margin_bytes"]
    return (
        item["key"],
        str(item["device"]),
        item["verdict"],
        "" if margin is None else ("-" if margin < 0 else "") + format_size(abs(margin)),
        item["mode"] or "",
        "" if item["k"] is None else f"{item['k']}/{item['s']}",
        item["rollback"] or "",
        item["traffic"],
        str(len(item["findings"])),
    )


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(cell) for cell in column) for column in zip(_COLUMNS, *rows, strict=True)]
    lines = ["  " + "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
             for line in [_COLUMNS, *rows]]
    return "\n".join(lines)
