"""Where each deployment of a fleet runs in a cluster: node selection, images, model volume, object name.

Resolved from the fleet's `[kubernetes]` table and each host's `[hosts.kubernetes]`
table. What is missing comes back as a located finding in the fleet file, never
as a guess: a host without node selection (PWR091), an engine without an image
(PWR069), a volume the fleet does not declare (PWR092), an artifact the volume
does not hold (PWR093), two deployments with one object name (PWR094), a value
the API server would reject (PWR097: checked here, at review, against
Kubernetes' own rules in k8s.io/apimachinery/pkg/util/validation, not when
`kubectl apply` fails).
"""

from __future__ import annotations

import difflib
import hashlib
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Final

from power.documents.plan import ResolvedPlan
from power.findings import Finding, Severity, has_errors
from power.orchestrator.inputs.loading import Loaded
from power.orchestrator.inputs.schema import (
    Deployment,
    EngineImages,
    Fleet,
    FleetKubernetes,
    HostKubernetes,
    HostSpec,
    ModelVolume,
)
from power.orchestrator.inputs.units import format_size
from power.orchestrator.kubernetes.objects import (
    API_KEY_DIR,
    CACHE_DIR,
    PLAN_DIR,
    ClusterPlacement,
    ModelMount,
    dry_run_image,
    unmounted_paths,
    unsourced_paths,
)

# Service names are DNS-1035 labels: lowercase letters, digits and '-', a letter first, at most 63 characters.
MAX_NAME = 63
# k8s.io/apimachinery/pkg/util/validation: IsValidLabelValue, IsDNS1123Subdomain, IsQualifiedName.
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
MAX_USER_ID = 2**31 - 1  # runAsUser / runAsGroup: validation.ValidateNonnegativeField on an int32 range
VERIFY_ENGINE: Final = "power"  # the init container runs `power verify`, so every pod needs Power's image


@dataclass(frozen=True)
class Placed:
    """One deployment of the review, as the Kubernetes render needs it."""

    index: int
    key: str
    deployment: Deployment
    plan: ResolvedPlan | None


def object_name(key: str) -> str:
    """A DNS-1035 label for a deployment key (`ws-1/qwen3.6-27b` -> `ws-1-qwen3-6-27b`); long keys keep a hash."""
    name = re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")
    if not name[:1].isalpha():
        name = f"power-{name}".rstrip("-")
    if len(name) > MAX_NAME:
        name = f"{name[:MAX_NAME - 9].rstrip('-')}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"
    return name


def model_mount(volume: ModelVolume) -> ModelMount:
    """The pod's volume source: a claim (writable only to a pulling init container), a node folder, or an emptyDir."""
    source: dict[str, Any]
    if volume.claim is not None:
        source = {"persistentVolumeClaim": {"claimName": volume.claim, "readOnly": not volume.pull}}
    elif volume.empty_dir:
        source = {"emptyDir": {}}
    else:
        source = {"hostPath": {"path": volume.host_path, "type": "Directory"}}
    return ModelMount(source=source, local=Path(volume.local), mount_path=volume.mount_path, pull=volume.pull,
                      token_secret=volume.token_secret)


def node_selector(placement: HostKubernetes | None) -> dict[str, str]:
    """The node labels a host's pods require: its node name (as the kubernetes.io/hostname label) and its selector."""
    if placement is None:
        return {}
    by_name = {"kubernetes.io/hostname": placement.node_name} if placement.node_name else {}
    return by_name | dict(placement.node_selector)


def tolerations(placement: HostKubernetes | None) -> tuple[dict, ...]:
    if placement is None:
        return ()
    keys = {"key": "key", "operator": "operator", "value": "value", "effect": "effect",
            "toleration_seconds": "tolerationSeconds"}
    return tuple({keys[k]: v for k, v in t.model_dump().items() if v is not None} for t in placement.tolerations)


def fleet_placements(loaded: Loaded, fleet: Fleet, items: list[Placed], require_images: bool
                     ) -> tuple[dict[str, ClusterPlacement], list[Finding]]:
    """A ClusterPlacement per deployment that has a plan, and every finding that keeps one from the cluster."""
    settings = fleet.kubernetes
    if settings is None:
        return {}, [
            loaded.finding(
                "PWR090",
                "the fleet declares no [kubernetes] settings: no images, no model volumes",
                where="schema",
                at="key",
                hint="add a [kubernetes] table with images = { ... } and [kubernetes.volumes.models]",
            )
        ]
    hosts = {host.name: (index, host) for index, host in enumerate(fleet.hosts)}
    findings: list[Finding] = _api_server_findings(loaded, fleet, settings)
    placements: dict[str, ClusterPlacement] = {}
    names: dict[str, str] = {}
    unselected: set[str] = set()
    reported: set[str] = set()
    for item in items:
        plan = item.plan
        if item.deployment.host not in hosts or plan is None:
            continue
        host_index, host = hosts[item.deployment.host]
        found = _selection_findings(loaded, host_index, host, unselected)
        if require_images:
            found += _image_findings(loaded, settings, item, host, reported)
        volume_name, volume_findings = _volume(loaded, settings, item)
        found += volume_findings
        if volume_name is not None:
            found += _outside_volume_findings(loaded, settings.volumes[volume_name], volume_name, item.key, plan)
        name = object_name(item.key)
        if name in names:
            found.append(loaded.finding("PWR094", f"deployments {names[name]} and {item.key} both become Kubernetes "
                                        f"objects named {name!r}", where=f"deployments[{item.index}]",
                                        hint="give one of them another `name`"))
        names.setdefault(name, item.key)
        findings += found
        if found or volume_name is None:
            continue
        images = _images(settings, host)
        engine = item.deployment.runs_on
        placements[item.key] = ClusterPlacement(
            key=item.key, name=name, engine=engine,
            image=images[engine] if require_images else dry_run_image(engine),
            verify_image=images[VERIFY_ENGINE] if require_images else dry_run_image(VERIFY_ENGINE),
            mount=model_mount(settings.volumes[volume_name]), node_selector=node_selector(host.kubernetes),
            tolerations=tolerations(host.kubernetes), fleet=fleet.name, host=host.name,
            namespace=settings.namespace, pod_monitor=settings.pod_monitor, run_as_user=settings.run_as_user,
            dry_run=not require_images, base_dir=loaded.path.absolute().parent,
            api_key_secret=item.deployment.api_key_secret,
            allow_namespaces=tuple(settings.allow_namespaces) if settings.allow_namespaces is not None else None)
    return placements, findings


def _api_server_findings(loaded: Loaded, fleet: Fleet, settings: FleetKubernetes) -> list[Finding]:
    """PWR097 for every value the render writes that the API server would reject, located in the fleet file."""
    findings: list[Finding] = []

    def reject(where: str, message: str, hint: str) -> None:
        findings.append(loaded.finding("PWR097", message, where=where, hint=hint))

    if fleet.name is not None and not _label_value(fleet.name):
        reject("name", f"the fleet name {_shown(fleet.name)} becomes the app.kubernetes.io/part-of label, and a "
               "label value is at most 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric",
               'rename the fleet, e.g. name = "lab"')
    for index, host in enumerate(fleet.hosts):
        if not _label_value(host.name):
            reject(f"hosts[{index}].name", f"host name {_shown(host.name)} becomes the power/host label, and a label "
                   "value is at most 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric",
                   'rename the host, e.g. name = "gpu-1"')
        placement = host.kubernetes
        if placement is None:
            continue
        if placement.node_name is not None and not _dns_subdomain(placement.node_name):
            reject(f"hosts[{index}].kubernetes.node_name", f"node_name {_shown(placement.node_name)} is not a "
                   "Kubernetes node name (lowercase letters, digits, '-' and '.', at most 253)",
                   "write the name `kubectl get nodes` shows")
        for key, value in placement.node_selector.items():
            if not _label_key(key) or not _label_value(value):
                reject(f"hosts[{index}].kubernetes.node_selector", f"node_selector {_shown(key)} = {_shown(value)} is "
                       "not a Kubernetes label (key: [prefix/]name of at most 63; value: at most 63 letters, digits, "
                       "'-', '_' or '.')", "copy the label from `kubectl get nodes --show-labels`")
    if settings.run_as_user > MAX_USER_ID:
        reject("kubernetes.run_as_user", f"run_as_user {settings.run_as_user} is past the largest user id Kubernetes "
               f"accepts ({MAX_USER_ID})", "use the image's non-root user id, e.g. 65532")
    reserved = {PLAN_DIR, "/tmp", CACHE_DIR, API_KEY_DIR}
    for name, volume in settings.volumes.items():
        taken = next((path for path in sorted(reserved) if _overlap(volume.mount_path, path)), None)
        if taken is not None:
            reject(f"kubernetes.volumes.{name}.mount_path", f"mount_path {volume.mount_path} overlaps where the pod "
                   f"already mounts {'the plan' if taken == PLAN_DIR else 'a volume of its own'} at {taken} (taken: "
                   f"{', '.join(sorted(reserved))}): two mounts at one path, or one over the other", "use /models")
    return findings


def _overlap(mount_path: str, taken: str) -> bool:
    """The model volume would be mounted at `taken` or over it (`/` holds every mount, and the image's whole
    tree); a volume inside one of the pod's own mounts is a nested mount Kubernetes orders by path."""
    mine, theirs = PurePosixPath(posixpath.normpath(mount_path)), PurePosixPath(taken)
    return mine == theirs or mine in theirs.parents


def _label_value(value: str) -> bool:
    return len(value) <= 63 and value.isascii() and _LABEL_VALUE.fullmatch(value) is not None


def _label_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    return (len(name) <= 63 and name.isascii() and _QUALIFIED_NAME.fullmatch(name) is not None
            and (not prefix or _dns_subdomain(prefix)))


def _dns_subdomain(value: str) -> bool:
    return len(value) <= 253 and value.isascii() and _DNS_SUBDOMAIN.fullmatch(value) is not None


def _shown(value: str) -> str:
    shown = ascii(value)
    return shown if len(shown) <= 72 else shown[:69] + "..."


def _selection_findings(loaded: Loaded, index: int, host: HostSpec, reported: set[str],
                        where: str | None = None) -> list[Finding]:
    if node_selector(host.kubernetes) or host.name in reported:
        return []
    reported.add(host.name)
    return [loaded.finding(
        "PWR091", f"host {host.name} names no node for Kubernetes: its pods could land on any GPU node",
        where=where or (f"hosts[{index}].kubernetes" if host.kubernetes else f"hosts[{index}].name"),
        hint=f"add [hosts.kubernetes] under this host with node_name = \"{host.name}\" or node_selector = "
             "{ \"nvidia.com/gpu.product\" = \"...\" }")]


def _image_findings(loaded: Loaded, settings: FleetKubernetes, item: Placed, host: HostSpec,
                    reported: set[str]) -> list[Finding]:
    """PWR069 for the deployment's engine, and once for Power's image, which every pod's `power verify` needs."""
    images = _images(settings, host)
    engine = item.deployment.runs_on
    findings = []
    if engine not in images:
        findings.append(loaded.finding(
            "PWR069", f"deployment {item.key} runs {engine}, and no image is named for {engine}",
            where=f"deployments[{item.index}].engine", hint=_image_hint(engine)))
    if VERIFY_ENGINE not in images and VERIFY_ENGINE != engine and VERIFY_ENGINE not in reported:
        reported.add(VERIFY_ENGINE)
        findings.append(loaded.finding(
            "PWR069", f"no image is named for {VERIFY_ENGINE}: every pod's init container runs `power verify` "
            f"(first needed by {item.key})", where="kubernetes.images", hint=_image_hint(VERIFY_ENGINE)))
    return findings


def _images(settings: FleetKubernetes, host: HostSpec) -> EngineImages:
    """Each engine's image: the host's own over the fleet's."""
    return settings.images | (host.kubernetes.images if host.kubernetes else {})


def _image_hint(engine: str, table: str = "the fleet's [kubernetes] table (or the host's [hosts.kubernetes])") -> str:
    return (f"add images = {{ {engine} = \"registry/image:tag\" }} to {table}; Power builds no images. "
            "`--dry-run` renders with placeholders")


def _volume(loaded: Loaded, settings: FleetKubernetes, item: Placed) -> tuple[str | None, list[Finding]]:
    declared = sorted(settings.volumes)
    wanted = item.deployment.volume
    if wanted is None and len(declared) == 1:
        return declared[0], []
    if wanted in settings.volumes:
        return wanted, []
    if wanted is None:
        problem = (
            "declares no model volume"
            if not declared
            else f"does not say which model volume ({', '.join(declared)}) holds its files"
        )
        return None, [loaded.finding(
            "PWR092", f"deployment {item.key}: the fleet {problem}", where=f"deployments[{item.index}]",
            hint="declare [kubernetes.volumes.models] with host_path = \"/srv/models\" (or claim = \"pvc-name\") and "
                 "local = \"the folder here whose copy it holds\"; with several, set `volume = "
                 "\"name\"` on the deployment")]
    close = difflib.get_close_matches(wanted, declared, n=1)
    return None, [loaded.finding(
        "PWR092", f"deployment {item.key} names model volume {wanted!r}, which [kubernetes.volumes] does not declare",
        where=f"deployments[{item.index}].volume",
        hint=f"did you mean {close[0]!r}?" if close else
             f"declare [kubernetes.volumes.{wanted}], or use one of: {', '.join(declared) or '(none declared)'}")]


def _outside_volume_findings(loaded: Loaded, volume: ModelVolume, name: str, key: str,
                             plan: ResolvedPlan) -> list[Finding]:
    return [*_unsourced_findings(loaded, volume, name, key, plan), *(loaded.finding(
        "PWR093", f"deployment {key}: {path} is not under volume {name}'s local folder {volume.local}, so the "
        "pod cannot see it", where=f"kubernetes.volumes.{name}.local",
        hint="point `local` at the folder holding every artifact the deployment's manifest names, or copy the "
             "files into it and fix the manifest's paths")
        for path in unmounted_paths(model_mount(volume), plan))]


def _unsourced_findings(loaded: Loaded, volume: ModelVolume, name: str, key: str,
                        plan: ResolvedPlan) -> list[Finding]:
    """PWR140: a pulling volume for a plan whose artifact names no source (the init container could not fetch it)."""
    if not volume.pull:
        return []
    return [loaded.finding(
        "PWR140", f"deployment {key}: volume {name} is filled by `power pull`, but the plan's {path} names no "
        "source", where=f"kubernetes.volumes.{name}.pull",
        hint="name the artifact's [target.source] / [drafters.source] in the manifest and re-plan, or fill the "
             "volume yourself (pull = false)")
        for path in unsourced_paths(plan)]


def _sized_for_host(loaded_host: Loaded, plan: ResolvedPlan) -> list[Finding]:
    """PWR464 when the host's devices are not the ones the plan was sized for (another model, size or kind): the
    plan's memory verdict says nothing about them."""
    host = loaded_host.model
    findings = []
    for device in plan.devices:
        there = host.devices[device.index] if device.index < len(host.devices) else None
        if there is None or (there.model, there.vram, there.kind) != (device.name, device.vram_bytes, device.kind):
            found = "no such device" if there is None else f"{there.model} ({format_size(there.vram)}, {there.kind})"
            findings.append(loaded_host.finding(
                "PWR464", f"the plan was sized for device {device.index} = {device.name} "
                f"({format_size(device.vram_bytes)}, {device.kind}); host {host.name} has {found}", where="devices",
                hint=f"plan it for this host (`power plan MANIFEST PROFILE --host {loaded_host.path}`), then render "
                     "that plan"))
    return findings


def host_placement(loaded_host: Loaded, plan: ResolvedPlan, engine: str, mount: ModelMount, *, dry_run: bool,
                   namespace: str | None = None, pod_monitor: bool = False,
                   api_key_secret: str | None = None) -> tuple[ClusterPlacement | None, list[Finding]]:
    """One plan placed on the host a host file describes (`power render PLAN --target kubernetes --host HOST`)."""
    host = loaded_host.model
    findings = list(loaded_host.findings)
    if host is None:
        return None, findings
    findings += _selection_findings(loaded_host, 0, host, set(), where="kubernetes" if host.kubernetes else "name")
    findings += _sized_for_host(loaded_host, plan)
    images = host.kubernetes.images if host.kubernetes else {}
    for needed in dict.fromkeys((engine, VERIFY_ENGINE)):
        if needed not in images and not dry_run:
            findings.append(loaded_host.finding("PWR069", f"the host file names no image for {needed}",
                                                where="kubernetes.images" if host.kubernetes else "name",
                                                hint=_image_hint(needed, "the host file's [kubernetes] table")))
    findings += [Finding(code="PWR093", severity=Severity.ERROR, file=path,
                         message=f"{path} is not under the model volume's local folder {mount.local}",
                         hint="pass --models-local with the folder holding every artifact the plan names")
                 for path in unmounted_paths(mount, plan)]
    if mount.pull:
        findings += [Finding(code="PWR140", severity=Severity.ERROR, file=path,
                             message=f"--models-pull: the plan's {path} names no source to pull it from",
                             hint="name the artifact's source in the manifest and re-plan, or fill the volume yourself")
                     for path in unsourced_paths(plan)]
    if has_errors(findings):
        return None, findings
    placement = ClusterPlacement(
        key=f"{host.name}/{plan.name}", name=object_name(f"{host.name}/{plan.name}"), engine=engine,
        image=dry_run_image(engine) if dry_run else images[engine],
        verify_image=dry_run_image(VERIFY_ENGINE) if dry_run else images[VERIFY_ENGINE],
        mount=mount, node_selector=node_selector(host.kubernetes), tolerations=tolerations(host.kubernetes),
        host=host.name, namespace=namespace, pod_monitor=pod_monitor, dry_run=dry_run,
        base_dir=loaded_host.path.absolute().parent, api_key_secret=api_key_secret)
    return placement, findings
