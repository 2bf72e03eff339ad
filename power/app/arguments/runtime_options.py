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


def greedy_head_option(command):
    """Adds --greedy-head on|off (parameter greedy_head, a bool): the operator's escape hatch from the exact greedy LM
    head (docs/runtime.md, "The exact greedy LM head"); it never changes a token."""
    return click.option("--greedy-head", type=click.Choice(["on", "off"]), default="on", show_default=True,
                        callback=lambda _context, _param, value: value == "on",
                        help="on: a greedy request's token from the exact greedy LM head where the model allows it (a "
                             "Q8_0 head on the CPU kernels, no final logit softcap), the full head's token bit for "
                             "bit; off: the full head for every row (the same tokens).")(command)


def refuse_unusable_device(device: str, as_json: bool = False) -> None:
    """A --device that cannot run here (an unknown name, CUDA on a host without it) refused before torch is imported:
    PWR601, exit 2 (`power.runtime.devices`)."""
    try:
        refuse_absent_device(device)
    except PowerError as err:
        refuse(err, as_json)
