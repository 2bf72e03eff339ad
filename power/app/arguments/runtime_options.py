"""The options every command that loads the runtime shares: device and threads.

Neither changes a token: the arithmetic is the plan's (`runtime.arithmetic`).
"""

from __future__ import annotations

import click

from power.app.cli import refuse
from power.findings import PowerError
from power.runtime.devices import refuse_absent_device


def runtime_options(command):
    """Adds --device and --threads (parameters device, threads)."""

    options = [
        click.option("--device", default="auto", show_default=True,
                     help="Where the target runs: auto (a CUDA GPU when torch sees one, else the CPU), cpu, cuda "
                          "or cuda:N. An unavailable device is an error, never a silent CPU run."),
        click.option("--threads", type=click.IntRange(min=1), default=None,
                     help="Torch intra-op threads (default: the CPUs this process may use: its affinity, "
                          "capped by its cgroup CPU quota; the receipt says which)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def refuse_unusable_device(device: str, as_json: bool = False) -> None:
    """A --device that cannot run here (an unknown name, CUDA on a host without it) refused before torch is imported:
    PWR601, exit 2 (`power.runtime.devices`)."""
    try:
        refuse_absent_device(device)
    except PowerError as err:
        refuse(err, as_json)
