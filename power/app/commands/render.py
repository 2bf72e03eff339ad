"""`power render PLAN --target ... [--root DIR]`: launch artifacts from a resolved plan whose artifacts verify."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from power.app.arguments.render import KUBERNETES, KubernetesArguments, RenderArguments, VolumeArguments, parse_render
from power.app.cli import EXIT_FINDINGS, print_findings, refuse
from power.app.commands.artifact_root import root_option
from power.app.outputs import require_outputs, writing
from power.artifacts.atomic import write_text_atomic
from power.artifacts.verify import cached_sha256
from power.documents.plan import ResolvedPlan, load_plan, located, planned_artifacts
from power.findings import PowerError, has_errors
from power.orchestrator.engines import ENGINES
from power.orchestrator.launch.render import TARGETS
from power.orchestrator.launch.render import render as render_plan

if TYPE_CHECKING:
    from power.orchestrator.inputs.schema import ModelVolume

@click.command("render")
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path))
@click.option("--target", "target", type=click.Choice([*TARGETS, KUBERNETES]), required=True, help="What to render.")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write to FILE (atomically) instead of stdout.")
@click.option("--host", "host_path", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="kubernetes: the host file whose [kubernetes] table names the node and the images.")
@click.option("--engine", type=click.Choice(ENGINES),
              help="kubernetes: the engine the container runs (default: the one the plan was sized for; another is "
                   "refused, PWR464).")
@click.option("--models-host-path", help="kubernetes: the folder on the node holding the model files (hostPath).")
@click.option("--models-claim", help="kubernetes: the PersistentVolumeClaim holding the model files.")
@click.option("--models-empty-dir", is_flag=True, help="kubernetes: an emptyDir the pod pulls the model files into "
              "(with --models-pull).")
@click.option("--models-pull", is_flag=True, help="kubernetes: an init container pulls the plan's artifacts from "
              "their sources into the model volume (`power pull`, checked by size and sha256) before `power verify`.")
@click.option("--models-token-secret", metavar="NAME", help="kubernetes: with --models-pull, the Secret whose key "
              "`token` the pull reads as HF_TOKEN (a gated or private repository); never read by the render.")
@click.option("--models-local", type=click.Path(path_type=Path, file_okay=False),
              help="kubernetes: the local folder the volume is a copy of (default: the target's folder).")
@click.option("--namespace", help="kubernetes: the objects' namespace (default: none, kubectl's current one).")
@click.option("--pod-monitor", is_flag=True, help="kubernetes: also a Prometheus Operator PodMonitor.")
@click.option("--dry-run", is_flag=True, help="kubernetes: placeholder images (under dry-run.invalid) "
                                              "instead of the host's.")
@click.option("--power-executable", metavar="PATH",
              help="systemd: the absolute path of `power` ExecStart= runs (default: this power's own).")
@click.option("--address", help="llama-server, llama-server-env, vllm, power: the address the server binds "
                                "(default: the engine's own, e.g. llama-server's 127.0.0.1).")
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    help="llama-server, llama-server-env, vllm, power: the port the server binds (default: the engine's own).",
)
@click.option("--api-key-file", metavar="PATH",
              help="llama-server, llama-server-env, vllm, power, systemd: the file on the serving machine holding "
                   "the API key clients must send; the render names the file, never the key.")
@click.option("--api-key-secret", metavar="NAME",
              help="kubernetes: the Secret (its key `api-key`) holding the API key clients must send; mounted into "
                   "the engine, never read by the render.")
@root_option
def render(plan_path: Path, target: str, output: Path | None, host_path: Path | None, engine: str | None,
           models_host_path: str | None, models_claim: str | None, models_empty_dir: bool, models_pull: bool,
           models_token_secret: str | None, models_local: Path | None, namespace: str | None, pod_monitor: bool,
           dry_run: bool, power_executable: str | None, address: str | None, port: int | None,
           api_key_file: str | None, api_key_secret: str | None, root: Path | None) -> None:
    """Render launch artifacts (llama-server and its LLAMA_ARG_* env file, vLLM, Power, env, systemd, Kubernetes)
    from a plan (JSON or TOML).

    Every artifact the plan names must be there with its planned size and sha256 (from the
    digest cache when the file is unchanged since it was hashed): one missing (PWR110) or
    another file (PWR115) renders nothing (exit 2). `power verify`, which hashes every byte, is
    the gate to run before the rendered engine starts.
    """
    arguments = parse_render(plan_path, target, output, root, address, port, api_key_file, power_executable,
                             host_path, engine, VolumeArguments(models_host_path, models_claim, models_empty_dir,
                                                                models_pull, models_token_secret, models_local),
                             namespace, pod_monitor, dry_run, api_key_secret)
    require_outputs(files=(output,))
    try:
        text = _rendered(arguments)
    except PowerError as err:
        refuse(err, at=plan_path)
    if output is None:
        click.echo(text, nl=False)
    else:
        with writing(output):
            write_text_atomic(output, text, executable=target in ENGINES)
        click.echo(f"wrote {output}", err=True)


def _rendered(arguments: RenderArguments) -> str:
    """The target's text for the plan, once every artifact it names is there with its planned size and sha256."""
    plan = located(load_plan(arguments.plan), arguments.plan, arguments.root)
    for artifact in planned_artifacts(plan):
        cached_sha256(artifact)
    if arguments.kubernetes is not None:
        return _kubernetes(plan, arguments.kubernetes)
    return render_plan(plan, arguments.target, arguments.plan, arguments.root, executable=arguments.power_executable,
                       listen=arguments.listen, api_key_file=arguments.api_key_file)


def _model_volume(plan: ResolvedPlan, volume: VolumeArguments) -> ModelVolume:
    from pydantic import ValidationError

    from power.orchestrator.inputs.schema import ModelVolume

    local = volume.local or Path(plan.target.path).parent
    try:
        return ModelVolume(host_path=volume.host_path, claim=volume.claim, empty_dir=volume.empty_dir,
                           pull=volume.pull, token_secret=volume.token_secret, local=local.resolve())
    except ValidationError as err:
        message = err.errors()[0]["msg"].removeprefix("Value error, ")
        raise click.UsageError(f"--models-*: {message}") from None


def _kubernetes(plan: ResolvedPlan, arguments: KubernetesArguments) -> str:
    from power.orchestrator.inputs.loading import load_host
    from power.orchestrator.kubernetes.objects import render_objects
    from power.orchestrator.kubernetes.placement import host_placement, model_mount
    from power.orchestrator.kubernetes.tree import yaml_text

    volume = _model_volume(plan, arguments.volume)
    placement, findings = host_placement(load_host(arguments.host), plan, arguments.engine or plan.memory.engine,
                                         model_mount(volume), dry_run=arguments.dry_run, namespace=arguments.namespace,
                                         pod_monitor=arguments.pod_monitor, api_key_secret=arguments.api_key_secret)
    if placement is None or has_errors(findings):
        print_findings(findings, as_json=False)
        raise SystemExit(EXIT_FINDINGS)
    return yaml_text(*render_objects(plan, placement))
