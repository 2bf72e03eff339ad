"""Where a plan runs and on which engine: the options `power plan` and `power size` share (`--host`, `--device`,
`--device-index`, `--engine`), read into a placement, and the `--device` size `power import` takes too."""

from __future__ import annotations

from pathlib import Path

import click

from power.app.cli import EXIT_FINDINGS, EXIT_USAGE
from power.documents.plan import DEFAULT_ENGINE
from power.findings import Finding
from power.orchestrator.engines import ENGINES, adapter
from power.orchestrator.inputs.loading import Loaded, load_host
from power.orchestrator.inputs.schema import DEFAULT_HEADROOM, DeviceSpec, HostSpec
from power.orchestrator.inputs.units import SizeError, format_size, parse_device_size
from power.orchestrator.planning.compile import Placed

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
