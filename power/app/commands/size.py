"""`power size MANIFEST PROFILE (--device SIZE... | --host HOST) [--device-index N...] [--engine E] [--ctx N]`:
the dry-run memory breakdown, device by device."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NoReturn

import click

from power.app.arguments.placement import engine_for, exit_code, placement_from_options, placement_options
from power.app.cli import EXIT_FINDINGS, EXIT_OK
from power.findings import Finding, has_errors
from power.orchestrator.inputs.loading import load_manifest, load_profile
from power.orchestrator.inputs.schema import MAX_CTX
from power.orchestrator.planning.checks.memory import check_memory
from power.orchestrator.planning.compile import (
    ArtifactMemo,
    check_artifacts,
    choose,
    memory_section,
    placement_findings,
    size_for,
)
from power.orchestrator.planning.plan_text import memory_text


@click.command("size")
@click.argument("manifest", type=click.Path(path_type=Path))
@click.argument("profile", type=click.Path(path_type=Path))
@placement_options
@click.option("--ctx", type=click.IntRange(min=1, max=MAX_CTX), help="Size at this context instead of the "
                                                                     "profile's runtime.ctx.")
@click.option("--json", "as_json", is_flag=True, help="Print the breakdown as JSON.")
def size(manifest, profile, host_path, sizes, indices, engine, ctx, as_json) -> None:
    """Per-device, per-component memory from the GGUF headers for one engine, each device's verdict, and the largest
    context that fits."""
    manifest_doc, profile_doc = load_manifest(manifest), load_profile(profile)
    engine = engine_for(engine, profile_doc)
    placed, findings = placement_from_options(host_path, sizes, indices, engine)
    findings += manifest_doc.findings + profile_doc.findings
    if placed is None or not (manifest_doc.ok and profile_doc.ok):
        _stop(findings)
    # Sizing reads headers only: digests are the plan's business.
    artifacts, found = check_artifacts(manifest_doc, ArtifactMemo(), with_digest=False)
    findings += found
    if artifacts is None or has_errors(findings):
        _stop(findings)
    chosen, found = choose(manifest_doc, profile_doc, artifacts)
    findings += found
    if chosen is None or has_errors(findings):
        _stop(findings)
    findings += placement_findings(manifest_doc, profile_doc, chosen, placed, artifacts.target.facts)
    if has_errors(findings):
        _stop(findings)
    sizing = size_for(profile_doc, chosen, artifacts, placed, ctx)
    findings += check_memory(profile_doc, sizing, chosen.drafter.facts if chosen.drafter else None)
    memory = memory_section(sizing)
    if as_json:
        click.echo(json.dumps({"engine": engine, "devices": [d.name for d in memory.devices],
                               "mode": chosen.resolution.resolved, "memory": memory.model_dump(mode="json"),
                               "findings": [f.to_json() for f in findings]}, indent=2))
    else:
        click.echo(f"{manifest_doc.model.name} + {profile_doc.model.name}: mode {chosen.resolution.resolved} "
                   f"({chosen.resolution.reason})")
        click.echo(memory_text(memory))
        for finding in findings:
            click.echo(finding.render(), err=True)
    sys.exit(EXIT_FINDINGS if has_errors(findings) else EXIT_OK)


def _stop(findings: list[Finding]) -> NoReturn:
    for finding in findings:
        click.echo(finding.render(), err=True)
    sys.exit(exit_code(findings))
