"""Fleet review: every deployment planned and checked, device sums, and drift against the fleet lock.

`review_fleet(path, lock_path)` never raises. It loads the fleet, checks each
deployment's place (the host exists, the device exists, paths that leave the
fleet's tree), compiles each deployment's plan, sums what shares a device, and
diffs the plans against the lock. Compiling goes through one `PlanMemo` for the
whole review: each manifest and profile is loaded once, each artifact's facts
and digest are read once (the compiler's artifact memo), and identical
(manifest, profile, device) triples compile once however many hosts run them.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from power.documents.plan import DEFAULT_ENGINE, ResolvedPlan
from power.findings import Finding, Severity, has_errors
from power.orchestrator.engines import adapter
from power.orchestrator.fleet.drift import Change, diff, render, summary
from power.orchestrator.fleet.lock import FleetLock, read_lock
from power.orchestrator.inputs.loading import Loaded, load_fleet
from power.orchestrator.inputs.schema import Deployment, Fleet, HostSpec
from power.orchestrator.inputs.units import format_size
from power.orchestrator.kubernetes.objects import ClusterPlacement, objects_digest, render_objects
from power.orchestrator.kubernetes.placement import Placed, fleet_placements
from power.orchestrator.planning.plan_memo import PlanMemo

DEFAULT_LOCK_NAME = "fleet.lock"
# `--detailed-exitcode`: clean, but the plans differ from the lock (terraform plan -detailed-exitcode).
DRIFT_EXIT = 3


@dataclass
class DeploymentReview:
    index: int
    key: str
    deployment: Deployment
    profile_name: str | None = None
    plan: ResolvedPlan | None = None
    findings: list[Finding] = field(default_factory=list)
    # sha256 of the deployment's rendered Kubernetes objects, when the fleet declares [kubernetes]
    objects_digest: str | None = None

    @property
    def record(self) -> dict[str, Any] | None:
        return plan_record(self.plan, self.deployment, self.profile_name, self.objects_digest) if self.plan else None

    def bytes_on(self, index: int) -> int:
        """What this deployment's plan puts on its host's device `index` (nothing without a plan)."""
        return bytes_on(self.plan, index) if self.plan else 0


@dataclass
class DeviceUse:
    host: HostSpec
    index: int
    deployments: list[DeploymentReview]

    @property
    def usable_bytes(self) -> int:
        return self.host.devices[self.index].vram - self.host.headroom

    @property
    def planned_bytes(self) -> int:
        return sum(d.bytes_on(self.index) for d in self.deployments)


def bytes_on(plan: ResolvedPlan, index: int) -> int:
    """What `plan` puts on the host's device `index` (a split plan puts a part on each of its devices)."""
    return sum(device.total_bytes for device in plan.memory.devices if device.index == index)


@dataclass
class FleetReview:
    path: Path
    lock_path: Path
    fleet: Fleet | None
    deployments: list[DeploymentReview] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    lock: FleetLock | None = None
    drift: list[Change] = field(default_factory=list)
    # where each deployment runs in a cluster, when the fleet declares [kubernetes] (key -> placement)
    placements: dict[str, ClusterPlacement] = field(default_factory=dict)
    # the fleet file as loaded, for findings located in it after the review
    loaded: Loaded | None = field(default=None, repr=False)

    @property
    def all_findings(self) -> list[Finding]:
        """Every finding once: deployments sharing a manifest or profile share its findings."""
        return list(dict.fromkeys(self.findings + [f for d in self.deployments for f in d.findings]))

    @property
    def name(self) -> str:
        return fleet_name(self.fleet, self.path) if self.fleet else self.path.stem

    @property
    def input_error(self) -> bool:
        """The fleet file itself could not be used, as opposed to findings about what it declares."""
        return self.fleet is None

    @property
    def has_errors(self) -> bool:
        return has_errors(self.all_findings)

    def records(self) -> dict[str, dict[str, Any]]:
        return {d.key: d.record for d in self.deployments if d.record is not None}

    def plans(self) -> dict[str, ResolvedPlan]:
        return {d.plan.digest: d.plan for d in self.deployments if d.plan}

    def device_uses(self) -> dict[str, list[DeviceUse]]:
        """Each host's devices, in order, with the deployments placed on each."""
        if self.fleet is None:
            return {}
        uses = {host.name: [DeviceUse(host, index,
                                      []) for index in range(len(host.devices))] for host in self.fleet.hosts}
        for item in self.deployments:
            devices = uses.get(item.deployment.host, [])
            for index in item.deployment.device_indices:
                if index < len(devices):
                    devices[index].deployments.append(item)
        return uses

    def drift_text(self) -> str:
        return render(self.drift)

    def objects_digest(self, key: str, plan: ResolvedPlan) -> str | None:
        """The digest of the objects `plan` renders to at deployment `key`'s placement (None: not in a cluster)."""
        placement = self.placements.get(key)
        return objects_digest(render_objects(plan, placement)) if placement else None

    def to_json(self) -> dict[str, Any]:
        return review_document(self)


def _device_field(deployment: Deployment) -> int | list[int]:
    """One device index, or the list of a deployment that spans several."""
    indices = deployment.device_indices
    return indices[0] if len(indices) == 1 else list(indices)


def plan_record(plan: ResolvedPlan, deployment: Deployment, profile_name: str | None,
                objects_digest: str | None = None) -> dict[str, Any]:
    """What the lock keeps for a deployment and drift compares: the plan's digest and the fields worth showing,
    and with [kubernetes] the digest of the objects it renders to (an image or node change shows as drift)."""
    record: dict[str, Any] = {
        "host": deployment.host,
        "device": _device_field(deployment),
        "manifest": plan.name,
        "profile": profile_name,
        "traffic": deployment.traffic,
        "engine": deployment.runs_on,
        "mode": plan.mode.resolved,
        "chain": list(plan.mode.chain),
        "k": plan.speculation.k,
        "s": plan.speculation.s,
        "rollback": plan.speculation.rollback,
        "fr_vocab_size": plan.speculation.fr_vocab_size,
        "ctx": plan.runtime.ctx,
        "target_sha256": plan.target.sha256,
        "drafter_sha256": [d.sha256 for d in plan.drafters if d.sha256],
        "verdict": plan.memory.verdict,
        "plan_digest": plan.digest,
    }
    # the defaults are left out, so records written before these settings stay the same
    if deployment.exactness != "exact":
        record["exactness"] = {"policy": deployment.exactness, "margin": deployment.near_tie_margin}
    if deployment.concurrency != 1:
        record["concurrency"] = deployment.concurrency
    if objects_digest is not None:
        record["objects_digest"] = objects_digest
    return record


def default_lock_path(fleet_path: Path) -> Path:
    return Path(fleet_path).parent / DEFAULT_LOCK_NAME


def fleet_name(fleet: Fleet, path: Path) -> str:
    """The fleet's identity, which its lock records: its `name`, else its file's name."""
    return fleet.name or Path(path).stem


def review_fleet(path: Path, lock_path: Path | None = None, memo: PlanMemo | None = None,
                 images_required: bool = True) -> FleetReview:
    """`images_required=False` (a Kubernetes dry run) places deployments whose engine has no image yet."""
    path = Path(path)
    lock_path = Path(lock_path) if lock_path else default_lock_path(path)
    loaded = load_fleet(path)
    review = FleetReview(path=path, lock_path=lock_path, fleet=loaded.model if loaded.ok else None,
                         findings=list(loaded.findings), loaded=loaded)
    if review.fleet is None:
        return review
    memo = memo or PlanMemo()
    hosts = {host.name: host for host in review.fleet.hosts}
    seen: dict[str, int] = {}
    for index, deployment in enumerate(review.fleet.deployments):
        item = _review_deployment(loaded, index, deployment, hosts, memo)
        if item.key in seen:
            item.findings.append(loaded.finding(
                "PWR066", f"deployment {item.key} is declared twice (first at deployments[{seen[item.key]}])",
                where=f"deployments[{index}].host",
                hint="give one of them its own `name = \"...\"`, or remove the duplicate"))
        seen.setdefault(item.key, index)
        review.deployments.append(item)
    review.findings += _device_sum_findings(loaded, review)
    if review.fleet.kubernetes is not None:
        _place(loaded, review, images_required)
    review.lock, lock_findings = read_lock(lock_path, fleet_name(review.fleet, path))
    review.findings += lock_findings
    if review.lock is not None:
        review.drift = diff(review.lock.deployments, review.records())
    return review


def _review_deployment(loaded: Loaded, index: int, deployment: Deployment, hosts: dict[str, HostSpec],
                       memo: PlanMemo) -> DeploymentReview:
    where = f"deployments[{index}]"
    findings = _outside_tree_findings(loaded, index) + _missing_file_findings(loaded, index, deployment)
    if has_errors(findings):
        return DeploymentReview(index=index,
                                key=f"{deployment.host}/{deployment.name or Path(deployment.manifest).stem}",
                                deployment=deployment, findings=findings)
    manifest = memo.manifest(deployment.manifest)
    profile = memo.profile(deployment.profile)
    if deployment.engine is None:
        deployment, defaulted = _engine_of(loaded, index, deployment, profile)
        findings += defaulted
    name = deployment.name or (manifest.model.name if manifest.ok else Path(deployment.manifest).stem)
    item = DeploymentReview(index=index, key=f"{deployment.host}/{name}", deployment=deployment, findings=findings,
                            profile_name=profile.model.name if profile.ok else None)
    misplaced = placement_findings(loaded, index, deployment, hosts, item.key)
    host = hosts.get(deployment.host)
    if misplaced or host is None:
        item.findings += misplaced
        return item
    if not (manifest.ok and profile.ok):
        item.findings += manifest.findings + profile.findings
    else:
        item.plan, plan_findings = memo.plan(manifest, profile, host, deployment.device_indices, deployment.runs_on)
        item.findings += plan_findings
        if item.plan is None and not has_errors(plan_findings):
            item.findings.append(loaded.finding("PWR067", f"deployment {item.key} could not be planned",
                                                where=where, hint="run `power plan` on its manifest and profile"))
    return item


def placement_findings(loaded: Loaded, index: int, deployment: Deployment, hosts: dict[str, HostSpec],
                       key: str) -> list[Finding]:
    """PWR060: the deployment's host is one the fleet defines, and its devices are that host's."""
    where = f"deployments[{index}]"
    host = hosts.get(deployment.host)
    if host is None:
        return [loaded.finding(
            "PWR060", f"deployment {key} names host {deployment.host!r}, which this fleet does not define",
            where=f"{where}.host", hint=_host_hint(deployment.host, hosts))]
    missing = [i for i in deployment.device_indices if i >= len(host.devices)]
    if missing:
        field_name = "device" if deployment.devices is None else "devices"
        return [loaded.finding(
            "PWR060", f"host {host.name} has {len(host.devices)} device(s); there is no device {missing[0]}",
            where=f"{where}.{field_name}", hint=f"use a device index from 0 to {len(host.devices) - 1}")]
    return []


def fleet_placement_findings(loaded: Loaded) -> list[Finding]:
    """Every deployment's PWR060 from the fleet file alone, nothing planned (`power validate`)."""
    fleet: Fleet = loaded.model
    hosts = {host.name: host for host in fleet.hosts}
    return [finding for index, deployment in enumerate(fleet.deployments)
            for finding in placement_findings(loaded, index, deployment, hosts,
                                              f"{deployment.host}/{deployment.name or Path(deployment.manifest).stem}")]


def _engine_of(loaded: Loaded, index: int, deployment: Deployment, profile: Loaded) -> tuple[Deployment, list[Finding]]:
    """A deployment that names no engine runs its profile's, else the default, which is said (PWR050): the
    engine decides what the plan allocates, so a silent default could change the verdict."""
    written_for = profile.model.engine if profile.ok else None
    engine = written_for or DEFAULT_ENGINE
    findings = [] if written_for else [loaded.finding(
        "PWR050", f"deployments[{index}] names no engine, nor does its profile: it is sized for the default, "
        f"{adapter(engine).description}", where=f"deployments[{index}]",
        hint='say which engine runs it: engine = "power" | "llama-server" | "vllm"')]
    return deployment.model_copy(update={"engine": engine}), findings


def _place(loaded: Loaded, review: FleetReview, images_required: bool) -> None:
    """Each planned deployment's place in the cluster, and the digest of the objects it renders to."""
    if review.fleet is None:
        return
    items = [Placed(d.index, d.key, d.deployment, d.plan) for d in review.deployments]
    review.placements, findings = fleet_placements(loaded, review.fleet, items, images_required)
    review.findings += findings + _shared_gpu_findings(loaded, review)
    for item in review.deployments:
        if item.plan is not None:
            item.objects_digest = review.objects_digest(item.key, item.plan)


def _shared_gpu_findings(loaded: Loaded, review: FleetReview) -> list[Finding]:
    """PWR096: in a cluster each pod requests its GPUs whole (`nvidia.com/gpu`), so a second deployment on a GPU
    another already holds would stay Pending: refused here rather than rendered. The fleet file alone says so,
    whether or not the deployments plan and place: reported with every other finding, never after them."""
    findings = []
    for use in (use for uses in review.device_uses().values() for use in uses):
        placed = use.deployments
        if len(placed) < 2 or use.host.devices[use.index].kind != "gpu":
            continue
        findings.append(loaded.finding(
            "PWR096", f"{', '.join(d.key for d in placed)} share {use.host.name} device {use.index}: each pod "
            "requests the whole GPU (nvidia.com/gpu), so only the first is scheduled and the others stay Pending",
            where=f"deployments[{placed[-1].index}].host",
            hint="give each deployment its own GPU in a cluster (the shell and systemd renders may share one)"))
    return findings


def _outside_tree_findings(loaded: Loaded, index: int) -> list[Finding]:
    """PWR061: a manifest or profile path that climbs out of the fleet's directory through `..` (allowed, shown)."""
    if loaded.data is None:
        return []
    raw = loaded.data["deployments"][index]
    fleet_dir = loaded.path.absolute().parent.resolve()
    findings = []
    for key in ("manifest", "profile"):
        value = str(raw.get(key, ""))
        if ".." in Path(value).parts and fleet_dir not in (fleet_dir / value).resolve().parents:
            findings.append(loaded.finding(
                "PWR061", f"{key} {value!r} leaves the fleet's directory ({fleet_dir}) through `..`",
                where=f"deployments[{index}].{key}", severity=Severity.WARNING,
                hint="allowed, but the fleet is then not self-contained: keep manifests and profiles under the "
                     "fleet's directory so one checkout reviews the same everywhere"))
    return findings


def _missing_file_findings(loaded: Loaded, index: int, deployment: Deployment) -> list[Finding]:
    """PWR001 at the fleet's own line when a deployment's manifest or profile does not exist."""
    return [loaded.finding("PWR001", f"{key} {Path(path)} does not exist", where=f"deployments[{index}].{key}",
                           hint=f"the {key} path is relative to the fleet file's directory")
            for key, path in (("manifest", deployment.manifest), ("profile", deployment.profile))
            if not Path(path).exists()]


def _device_sum_findings(loaded: Loaded, review: FleetReview) -> list[Finding]:
    """PWR062: deployments sharing a device whose planned bytes together exceed what the device offers."""
    findings = []
    uses = [use for host_uses in review.device_uses().values() for use in host_uses]
    for use in uses:
        planned = [d for d in use.deployments if d.plan]
        if len(planned) < 2 or use.planned_bytes <= use.usable_bytes:
            continue
        device = use.host.devices[use.index]
        parts = " + ".join(f"{d.key} {format_size(d.bytes_on(use.index))}" for d in planned)
        findings.append(loaded.finding(
            "PWR062",
            f"{use.host.name} device {use.index} ({device.model}, {format_size(device.vram)}): {parts} = "
            f"{format_size(use.planned_bytes)}, over the {format_size(use.usable_bytes)} usable after "
            f"{format_size(use.host.headroom)} headroom",
            where=f"deployments[{planned[-1].index}].host",
            hint=_move_hint(planned[-1], use, uses)))
    return findings


def _move_hint(moving: DeploymentReview, here: DeviceUse, uses: list[DeviceUse]) -> str:
    """Devices with room left for the last deployment on an overfull one (its planned bytes do not depend on
    the device's size), else the generic advice."""
    needed = moving.bytes_on(here.index)
    room = [use for use in uses if use is not here and use.usable_bytes - use.planned_bytes >= needed]
    if room:
        places = ", ".join(f"{use.host.name} device {use.index}" for use in room[:3])
        return (f"{moving.key} ({format_size(needed)}) fits as planned on {places}; "
                "or shrink a plan (context, KV type, drafter)")
    return "move one deployment to another device or host, or shrink a plan (context, KV type, drafter)"


def _host_hint(name: str, hosts: dict[str, HostSpec]) -> str:
    close = difflib.get_close_matches(name, list(hosts), n=1)
    known = ", ".join(sorted(hosts)) or "(none)"
    return f"did you mean {close[0]!r}?" if close else f"add a [[hosts]] entry named {name!r}, or use one of: {known}"


def review_document(review: FleetReview) -> dict[str, Any]:
    """The review as JSON data (`power fleet review --json` and the HTML report read this)."""
    findings = review.all_findings
    hosts = review.fleet.hosts if review.fleet else []
    device_uses = review.device_uses()
    by_host: dict[str, list[DeploymentReview]] = {}
    for item in review.deployments:
        by_host.setdefault(item.deployment.host, []).append(item)
    return {
        "schema": "power.fleet-review/v1",
        "fleet": str(review.path),
        "name": review.name,
        "lock": str(review.lock_path),
        "summary": {
            "hosts": len(review.fleet.hosts) if review.fleet else 0,
            "deployments": len(review.deployments),
            "errors": sum(1 for f in findings if f.severity is Severity.ERROR),
            "warnings": sum(1 for f in findings if f.severity is Severity.WARNING),
            "drift": summary(review.drift) if review.lock is not None else "drift unknown (the lock cannot be read)",
        },
        "hosts": [_host_document(host, device_uses[host.name], by_host.get(host.name, [])) for host in hosts],
        "findings": [f.to_json() for f in _unhosted_findings(review)],
        "drift": [change.to_json() for change in review.drift],
    }


def _unhosted_findings(review: FleetReview) -> list[Finding]:
    """Findings no host section shows: the fleet's own, the lock's, and those of deployments on unknown hosts."""
    hosts = {host.name for host in review.fleet.hosts} if review.fleet else set()
    orphans = [f for d in review.deployments if d.deployment.host not in hosts for f in d.findings]
    return list(dict.fromkeys(review.findings + orphans))


def _host_document(host: HostSpec, uses: list[DeviceUse], deployments: list[DeploymentReview]) -> dict[str, Any]:
    return {
        "name": host.name,
        "labels": dict(host.labels),
        "headroom_bytes": host.headroom,
        "devices": [{
            "index": use.index,
            "model": host.devices[use.index].model,
            "vram_bytes": host.devices[use.index].vram,
            "planned_bytes": use.planned_bytes,
            "uses": [{"key": d.key, "bytes": d.bytes_on(use.index)} for d in use.deployments if d.plan],
            "unplanned": [d.key for d in use.deployments if not d.plan],
        } for use in uses],
        "deployments": [_deployment_document(d) for d in deployments],
    }


def _deployment_document(item: DeploymentReview) -> dict[str, Any]:
    plan = item.plan
    return {
        "key": item.key,
        "device": _device_field(item.deployment),
        "manifest": os.fspath(item.deployment.manifest),
        "profile": os.fspath(item.deployment.profile),
        "traffic": item.deployment.traffic,
        "verdict": plan.memory.verdict if plan else "no plan",
        "margin_bytes": plan.memory.margin_bytes if plan else None,
        "mode": plan.mode.resolved if plan else None,
        "k": plan.speculation.k if plan else None,
        "s": plan.speculation.s if plan else None,
        "rollback": plan.speculation.rollback if plan else None,
        "plan_digest": plan.digest if plan else None,
        "findings": [f.to_json() for f in item.findings],
    }


def exit_code(review: FleetReview, detailed: bool) -> int:
    """0 clean, 1 error findings (the fleet file's own included), 3 (with --detailed-exitcode) clean but drifted.

    A fleet path that does not exist is a usage error (2), caught before the review runs.
    """
    if review.has_errors:
        return 1
    return DRIFT_EXIT if detailed and review.drift else 0
