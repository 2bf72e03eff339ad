"""`power render`'s arguments: the target, where the server listens and finds its API key, and for Kubernetes the
node, the model volume and the objects' options; the per-target rules are checked here."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import click

from power.orchestrator.render import Listen

KUBERNETES = "kubernetes"
# Power's env file carries the runtime's variables only: no engine command line to name a key file in.
VARIABLES_ONLY = "env"
SECRET_NAME = r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?"


@dataclass(frozen=True)
class VolumeArguments:
    """The model volume a pod mounts: exactly one of a node folder, a claim or an emptyDir the pod pulls into."""

    host_path: str | None
    claim: str | None
    empty_dir: bool
    pull: bool
    token_secret: str | None
    local: Path | None  # the local folder the volume is a copy of (None: the target's folder)


@dataclass(frozen=True)
class KubernetesArguments:
    host: Path
    engine: str | None  # None: the engine the plan was sized for
    volume: VolumeArguments
    namespace: str | None
    pod_monitor: bool
    dry_run: bool
    api_key_secret: str | None


@dataclass(frozen=True)
class RenderArguments:
    plan: Path
    target: str
    output: Path | None
    root: Path | None
    listen: Listen | None  # None: the engine's own default address
    api_key_file: str | None
    power_executable: str | None
    kubernetes: KubernetesArguments | None  # the Kubernetes target's own arguments (None for every other target)


def parse_render(plan: Path, target: str, output: Path | None, root: Path | None, address: str | None,
                 port: int | None, api_key_file: str | None, power_executable: str | None, host: Path | None,
                 engine: str | None, volume: VolumeArguments, namespace: str | None, pod_monitor: bool,
                 dry_run: bool, api_key_secret: str | None) -> RenderArguments:
    """The record of one `power render`; click.UsageError (exit 2) for options that do not go together."""
    if (address is None) != (port is None):
        raise click.UsageError("--address and --port go together: give both, or neither for the engine's default")
    _key_options(target, api_key_file, api_key_secret)
    kubernetes = None
    if target == KUBERNETES:
        if host is None:
            raise click.UsageError("--target kubernetes needs --host HOST.toml (its [kubernetes] table names the node "
                                   "and the images)")
        if sum((volume.host_path is not None, volume.claim is not None, volume.empty_dir)) != 1:
            raise click.UsageError("--target kubernetes needs one of --models-host-path, --models-claim or "
                                   "--models-empty-dir (with --models-pull)")
        kubernetes = KubernetesArguments(host, engine, volume, namespace, pod_monitor, dry_run, api_key_secret)
    listen = Listen(address, port) if address and port else None
    return RenderArguments(plan, target, output, root, listen, api_key_file, power_executable, kubernetes)


def _key_options(target: str, api_key_file: str | None, api_key_secret: str | None) -> None:
    """An engine launch names the key's file (--api-key-file); Kubernetes mounts it from a Secret (--api-key-secret)."""
    if api_key_file is not None and target in (VARIABLES_ONLY, KUBERNETES):
        raise click.UsageError(f"--api-key-file applies to the engine launches; --target {target} "
                               + ("takes the key from a Secret: --api-key-secret NAME" if target == KUBERNETES
                                  else "carries no engine command line"))
    if api_key_secret is not None and (target != KUBERNETES or not re.fullmatch(SECRET_NAME, api_key_secret)):
        raise click.UsageError("--api-key-secret names a Kubernetes Secret (lowercase letters, digits, '-', '.') "
                               "and applies to --target kubernetes; the other targets take --api-key-file PATH")
