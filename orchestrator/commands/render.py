"""`power render PLAN --target ... [--root DIR]`: launch artifacts from a resolved plan whose artifacts verify."""

from __future__ import annotations

from pathlib import Path

import click

from power.artifacts.atomic import write_text_atomic
from power.artifacts.verify import verified_sha256
from power.findings import PowerError
from power.orchestrator.cli import refuse
from power.orchestrator.commands.artifact_root import root_option
from power.orchestrator.plan import load_plan, located, planned_artifacts
from power.orchestrator.render import TARGETS
from power.orchestrator.render import render as render_plan


@click.command("render")
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path))
@click.option("--target", "target", type=click.Choice(TARGETS), required=True, help="What to render.")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write to FILE (atomically) instead of stdout.")
@root_option
def render(plan_path: Path, target: str, output: Path | None, root: Path | None) -> None:
    """Render launch artifacts (llama-server, vLLM, Power, env, systemd) from a plan (JSON or TOML).

    Every artifact the plan names is hashed in full first: a file that is not the one the plan
    was compiled with (PWR115) or is missing (PWR110) renders nothing (exit 2). The rendered
    launch names the artifacts where they were verified.
    """
    try:
        plan = located(load_plan(plan_path), plan_path, root)
        for artifact in planned_artifacts(plan):
            verified_sha256(artifact)
        text = render_plan(plan, target, plan_path, root)
    except PowerError as err:
        refuse(err)
    if output is None:
        click.echo(text, nl=False)
    else:
        write_text_atomic(output, text)
        if target not in ("env", "systemd"):
            output.chmod(0o755)
        click.echo(f"wrote {output}", err=True)
