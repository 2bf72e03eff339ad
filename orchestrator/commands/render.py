"""`power render PLAN --target ...`: launch artifacts from a resolved plan."""

from __future__ import annotations

from pathlib import Path

import click

from power.artifacts.atomic import write_text_atomic
from power.findings import PowerError
from power.orchestrator.cli import refuse
from power.orchestrator.outputs import require_outputs, writing
from power.orchestrator.plan import load_plan
from power.orchestrator.render import TARGETS
from power.orchestrator.render import render as render_plan


@click.command("render")
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path))
@click.option("--target", "target", type=click.Choice(TARGETS), required=True, help="What to render.")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write to FILE (atomically) instead of stdout.")
@click.option("--power-executable", metavar="PATH",
              help="The absolute path of `power` the systemd unit's ExecStart= runs (default: this power's own).")
def render(plan_path: Path, target: str, output: Path | None, power_executable: str | None) -> None:
    """Render launch artifacts (llama-server, vLLM, Power, env, systemd) from a plan (JSON or TOML)."""
    require_outputs(files=(output,))
    try:
        text = render_plan(load_plan(plan_path), target, plan_path, executable=power_executable)
    except PowerError as err:
        refuse(err)
    if output is None:
        click.echo(text, nl=False)
    else:
        with writing(output):
            write_text_atomic(output, text, executable=target not in ("env", "systemd"))
        click.echo(f"wrote {output}", err=True)
