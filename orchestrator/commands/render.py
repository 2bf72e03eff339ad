"""`power render PLAN --target ...`: launch artifacts from a resolved plan."""

from __future__ import annotations

from pathlib import Path

import click

from power.artifacts.atomic import write_text_atomic
from power.findings import PowerError
from power.orchestrator.cli import refuse
from power.orchestrator.plan import load_plan
from power.orchestrator.render import TARGETS, Listen
from power.orchestrator.render import render as render_plan


@click.command("render")
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path))
@click.option("--target", "target", type=click.Choice(TARGETS), required=True, help="What to render.")
@click.option("--host", default=Listen.host, show_default=True, help="The address the rendered server listens on.")
@click.option("--port", type=click.IntRange(1, 65535), default=Listen.port, show_default=True,
              help="The port the rendered server listens on.")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write to FILE (atomically) instead of stdout.")
def render(plan_path: Path, target: str, host: str, port: int, output: Path | None) -> None:
    """Render launch artifacts (llama-server and its LLAMA_ARG_* env file, vLLM, Power, env, systemd) from a plan."""
    try:
        text = render_plan(load_plan(plan_path), target, plan_path, Listen(host, port))
    except PowerError as err:
        refuse(err)
    if output is None:
        click.echo(text, nl=False)
    else:
        write_text_atomic(output, text)
        if target in ("llama-server", "vllm", "power"):
            output.chmod(0o755)
        click.echo(f"wrote {output}", err=True)
