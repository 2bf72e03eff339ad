"""`power plan MANIFEST PROFILE (--host HOST | --device SIZE...) [--device-index N...] [--engine E]`: compile a plan."""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path
from typing import NoReturn

import click

from power.app.arguments.placement import engine_for, exit_code, placement_from_options, placement_options
from power.app.cli import EXIT_OK
from power.app.outputs import require_outputs, writing
from power.artifacts.gguf_reader import read_header
from power.documents.plan import ResolvedPlan, planned_artifacts, save_plan, to_json, to_toml
from power.findings import Finding
from power.orchestrator.engines import adapter
from power.orchestrator.inputs.loading import load_manifest, load_profile
from power.orchestrator.planning.compile import compile_plan
from power.orchestrator.planning.plan_text import summary_text
from power.runtime.host_room import mib, room_for


@click.command("plan")
@click.argument("manifest", type=click.Path(path_type=Path))
@click.argument("profile", type=click.Path(path_type=Path))
@placement_options
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="Write the plan (JSON, or TOML for a .toml name).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan document as JSON.")
@click.option("--toml", "as_toml", is_flag=True, help="Print the plan document as TOML.")
def plan(manifest, profile, host_path, sizes, indices, engine, output, as_json, as_toml) -> None:
    """Compile MANIFEST + PROFILE for a host into a resolved engine plan; refuse with every finding."""
    require_outputs(files=(output,), as_json=as_json)
    profile_doc = load_profile(profile)
    engine = engine_for(engine, profile_doc)
    placed, findings = placement_from_options(host_path, sizes, indices, engine)
    resolved = None
    if placed is not None:
        resolved, compiled = compile_plan(load_manifest(manifest), profile_doc, placed.host, placed.devices,
                                          host_path=host_path, engine=engine)
        findings = findings + compiled
    if resolved is None:
        _refuse(findings, as_json)
    if output is not None:
        with writing(output, as_json):
            save_plan(resolved, output)
    if as_json:
        click.echo(to_json(resolved), nl=False)
    elif as_toml:
        click.echo(to_toml(resolved), nl=False)
    else:
        for finding in findings:
            click.echo(finding.render(), err=True)
        click.echo(summary_text(resolved))
        if adapter(resolved.memory.engine).checks_host_memory:
            click.echo(host_memory_line(resolved))
        if output is not None:
            click.echo(f"wrote {output}")
    sys.exit(EXIT_OK)


def host_memory_line(plan: ResolvedPlan) -> str:
    """Whether this host can hold the weights Power's runtime keeps in host memory on the CPU: the figures the
    runtime refuses on at load (PWR520), judged here for the machine `power plan` runs on, not sealed in the plan."""
    tensors = {a.path.name: sum(t.nbytes for t in read_header(a.path).tensors) for a in planned_artifacts(plan)}
    room = room_for(sum(tensors.values()))
    verdict = "fits" if room.fits else ("does not fit: `power run`, `serve` and `bench` on this host's CPU refuse it "
                                        "before loading (PWR520)")
    return (f"  host memory on this host ({platform.node() or 'unnamed'}, where `power plan` ran; the plan itself is "
            f"portable): on the CPU the runtime holds at least {mib(room.needed)} of weights "
            f"({', '.join(f'{name} {mib(size)}' for name, size in tensors.items())}); {room.figures()}: {verdict}")


def _refuse(findings: list[Finding], as_json: bool) -> NoReturn:
    if as_json:
        click.echo(json.dumps({"plan": None, "findings": [f.to_json() for f in findings]}, indent=2))
    for finding in findings:
        click.echo(finding.render(), err=True)
    errors = sum(1 for f in findings if f.is_error)
    click.echo(f"no plan: {errors} error(s); fix them and run `power plan` again", err=True)
    sys.exit(exit_code(findings))
