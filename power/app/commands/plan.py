"""`power plan MANIFEST PROFILE (--host HOST | --device SIZE...) [--device-index N...] [--engine E]`: compile a plan."""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path
from typing import NoReturn

import click

from power.app.cli import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from power.app.outputs import require_outputs, writing
from power.artifacts.gguf_reader import read_header
from power.documents.plan import DEFAULT_ENGINE, ResolvedPlan, planned_artifacts, save_plan, to_json, to_toml
from power.findings import Finding
from power.orchestrator.engines import ENGINES, adapter
from power.orchestrator.inputs.loading import Loaded, load_host, load_manifest, load_profile
from power.orchestrator.inputs.schema import DEFAULT_HEADROOM, DeviceSpec, HostSpec
from power.orchestrator.inputs.units import SizeError, format_size, parse_device_size
from power.orchestrator.planning.compile import Placed, compile_plan
from power.orchestrator.planning.plan_text import summary_text
from power.runtime.host_room import mib, room_for

# Loader codes that mean the command was pointed at nothing: usage errors, not check failures.
USAGE_CODES = {"PWR001", "PWR009"}


class DeviceSize(click.ParamType):
    name = "size"

    def convert(self, value, param, ctx) -> int:
        try:
            return parse_device_size(value)
        except SizeError as err:
            self.fail(str(err), param, ctx)


def host_from_options(host_path: Path | None, sizes: tuple[int, ...]) -> tuple[HostSpec | None, list[Finding]]:
    """The host to plan for: a host file, or one device per --device size with the default headroom."""
    if host_path is not None:
        loaded = load_host(host_path)
        return (loaded.model if loaded.ok else None), loaded.findings
    return HostSpec(name="command line", devices=[DeviceSpec(model=f"{format_size(size)} device", vram=size)
                                                  for size in sizes], headroom=DEFAULT_HEADROOM), []


def placement_from_options(host_path: Path | None, sizes: tuple[int, ...], indices: tuple[int, ...],
                           engine: str) -> tuple[Placed | None, list[Finding]]:
    """Where to plan: the --device-index devices (default: every --device given, or the host's device 0)."""
    if (host_path is None) == (not sizes):
        raise click.UsageError("give exactly one of --host HOST.toml or --device SIZE (repeat --device for several)")
    host, findings = host_from_options(host_path, sizes)
    if host is None:
        return None, findings
    chosen = indices or (tuple(range(len(host.devices))) if host_path is None else (0,))
    missing = [i for i in chosen if i >= len(host.devices)]
    if missing:
        raise click.UsageError(f"--device-index {missing[0]}: {host_path or 'the command line'} has "
                               f"{len(host.devices)} device(s)")
    if len(set(chosen)) != len(chosen):
        raise click.UsageError(f"--device-index names a device twice: {list(chosen)}")
    return Placed(host, chosen, engine), findings


def placement_options(command):
    """The options `power plan` and `power size` share: where the plan runs and on which engine."""
    options = [
        click.option("--host", "host_path", type=click.Path(path_type=Path), help="A host file (power.host/v1)."),
        click.option("--device", "sizes", type=DeviceSize(), multiple=True,
                     help='A device of this size, e.g. "24 GiB" (headroom 512 MiB); repeat for several.'),
        click.option("--device-index", "indices", type=click.IntRange(min=0), multiple=True,
                     help="Which device(s) to run on, by index (repeat for a split; default: every --device, or the "
                          "host's device 0)."),
        click.option("--engine", type=click.Choice(ENGINES),
                     help="The engine whose allocation is sized (a fleet deployment's `engine`; default: the "
                          "profile's `engine`, else power)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def engine_for(option: str | None, profile: Loaded) -> str:
    """--engine, else the engine the profile was written for, else the default, which is said on stderr (another
    engine allocates other memory, so the verdict depends on it)."""
    written_for = profile.model.engine if profile.ok else None
    engine = option or written_for or DEFAULT_ENGINE
    if option is None and written_for is None:
        click.echo(f"note: sized for {adapter(engine).description}, the default engine (no --engine, and the profile "
                   "names none)", err=True)
    return engine


def exit_code(findings: list[Finding]) -> int:
    return EXIT_USAGE if any(f.code in USAGE_CODES for f in findings) else EXIT_FINDINGS


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
