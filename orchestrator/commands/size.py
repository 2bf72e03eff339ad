"""`power size MANIFEST PROFILE (--device SIZE | --host HOST) [--ctx N]`: the dry-run VRAM breakdown."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NoReturn

import click

from power.findings import Finding, has_errors
from power.orchestrator.checks.memory import check_memory
from power.orchestrator.cli import EXIT_FINDINGS, EXIT_OK
from power.orchestrator.commands.plan import DeviceSize, exit_code, host_from_options
from power.orchestrator.compile import ArtifactMemo, budget_of, check_artifacts, choose, memory_section, size_for
from power.orchestrator.loading import load_manifest, load_profile
from power.orchestrator.plan_text import memory_text


@click.command("size")
@click.argument("manifest", type=click.Path(path_type=Path))
@click.argument("profile", type=click.Path(path_type=Path))
@click.option("--device", type=DeviceSize(), help='One device of this size, e.g. "24 GiB" (headroom 512 MiB).')
@click.option("--host", "host_path", type=click.Path(path_type=Path), help="A host file (power.host/v1).")
@click.option("--device-index", type=click.IntRange(min=0), default=0, show_default=True,
              help="Which of the host's devices to size for.")
@click.option("--ctx", type=click.IntRange(min=1), help="Size at this context instead of the profile's runtime.ctx.")
@click.option("--json", "as_json", is_flag=True, help="Print the breakdown as JSON.")
def size(manifest, profile, device, host_path, device_index, ctx, as_json) -> None:
    """Per-component VRAM breakdown from the GGUF headers, the verdict, and the largest context that fits."""
    host, findings = host_from_options(host_path, device)
    if host is not None and device_index >= len(host.devices):
        raise click.UsageError(f"--device-index {device_index}: {host_path} has {len(host.devices)} device(s)")
    manifest_doc, profile_doc = load_manifest(manifest), load_profile(profile)
    findings += manifest_doc.findings + profile_doc.findings
    if host is None or not (manifest_doc.ok and profile_doc.ok):
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
    budget, device_name = budget_of(host, device_index)
    sizing = size_for(profile_doc, chosen, artifacts, budget, ctx)
    findings += check_memory(profile_doc, sizing, device_name, chosen.drafter.facts if chosen.drafter else None)
    memory = memory_section(sizing)
    if as_json:
        click.echo(json.dumps({"device": device_name, "mode": chosen.resolution.resolved,
                               "memory": memory.model_dump(mode="json"),
                               "findings": [f.to_json() for f in findings]}, indent=2))
    else:
        click.echo(f"{manifest_doc.model.name} + {profile_doc.model.name}: mode {chosen.resolution.resolved} "
                   f"({chosen.resolution.reason})")
        click.echo(memory_text(memory, device_name))
        for finding in findings:
            click.echo(finding.render(), err=True)
    sys.exit(EXIT_FINDINGS if has_errors(findings) else EXIT_OK)


def _stop(findings: list[Finding]) -> NoReturn:
    for finding in findings:
        click.echo(finding.render(), err=True)
    sys.exit(exit_code(findings))
