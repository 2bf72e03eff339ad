"""`power plan MANIFEST PROFILE (--host HOST | --device SIZE)`: compile a resolved engine plan."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NoReturn

import click

from power.findings import Finding
from power.orchestrator.cli import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from power.orchestrator.compile import compile_plan
from power.orchestrator.loading import load_host, load_manifest, load_profile
from power.orchestrator.plan import save_plan, to_json, to_toml
from power.orchestrator.plan_text import summary_text
from power.orchestrator.schema import DEFAULT_HEADROOM, DeviceSpec, HostSpec
from power.orchestrator.units import SizeError, format_size, parse_size

# Loader codes that mean the command was pointed at nothing: usage errors, not check failures.
USAGE_CODES = {"PWR001", "PWR009"}


class DeviceSize(click.ParamType):
    name = "size"

    def convert(self, value, param, ctx) -> int:
        try:
            return parse_size(value)
        except SizeError as err:
            self.fail(f"{err}; write e.g. \"24 GiB\"", param, ctx)


def host_from_options(host_path: Path | None, device: int | None) -> tuple[HostSpec | None, list[Finding]]:
    """The host to plan for: a host file, or one device of the given size with the default headroom (exactly one)."""
    if host_path is not None and device is None:
        loaded = load_host(host_path)
        return (loaded.model if loaded.ok else None), loaded.findings
    if device is not None and host_path is None:
        return HostSpec(name="command line", devices=[DeviceSpec(model=f"{format_size(device)} device", vram=device)],
                        headroom=DEFAULT_HEADROOM), []
    raise click.UsageError("give exactly one of --host HOST.toml or --device SIZE")


def exit_code(findings: list[Finding]) -> int:
    return EXIT_USAGE if any(f.code in USAGE_CODES for f in findings) else EXIT_FINDINGS


@click.command("plan")
@click.argument("manifest", type=click.Path(path_type=Path))
@click.argument("profile", type=click.Path(path_type=Path))
@click.option("--host", "host_path", type=click.Path(path_type=Path), help="A host file (power.host/v1).")
@click.option("--device", type=DeviceSize(), help='One device of this size, e.g. "24 GiB" (headroom 512 MiB).')
@click.option("--device-index", type=click.IntRange(min=0), default=0, show_default=True,
              help="Which of the host's devices to plan for.")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write the plan (JSON, or TOML for a .toml name).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan document as JSON.")
@click.option("--toml", "as_toml", is_flag=True, help="Print the plan document as TOML.")
def plan(manifest, profile, host_path, device, device_index, output, as_json, as_toml) -> None:
    """Compile MANIFEST + PROFILE for a host into a resolved engine plan; refuse with every finding."""
    host, findings = host_from_options(host_path, device)
    if host is not None and device_index >= len(host.devices):
        raise click.UsageError(f"--device-index {device_index}: {host_path} has {len(host.devices)} device(s)")
    resolved = None
    if host is not None:
        resolved, compiled = compile_plan(load_manifest(manifest), load_profile(profile), host, device_index,
                                          host_path=host_path)
        findings = findings + compiled
    if resolved is None:
        _refuse(findings, as_json)
    if output is not None:
        save_plan(resolved, output)
    if as_json:
        click.echo(to_json(resolved), nl=False)
    elif as_toml:
        click.echo(to_toml(resolved), nl=False)
    else:
        for finding in findings:
            click.echo(finding.render(), err=True)
        click.echo(summary_text(resolved))
        if output is not None:
            click.echo(f"wrote {output}")
    sys.exit(EXIT_OK)


def _refuse(findings: list[Finding], as_json: bool) -> NoReturn:
    if as_json:
        click.echo(json.dumps({"plan": None, "findings": [f.to_json() for f in findings]}, indent=2))
    for finding in findings:
        click.echo(finding.render(), err=True)
    errors = sum(1 for f in findings if f.is_error)
    click.echo(f"no plan: {errors} error(s); fix them and run `power plan` again", err=True)
    sys.exit(exit_code(findings))
