"""The Kubernetes objects of one placed plan: the plan's ConfigMap, a Deployment, a Service, a PodDisruptionBudget,
and a Prometheus Operator PodMonitor when asked.

The engine container runs `engine_launch`'s command line (the one the shell
renders print) on the plan carried in the ConfigMap, whose artifact paths are
rewritten to where the pod sees the model volume (paths are outside the plan's
digest, so the seal holds). An init container runs `power verify` on that plan,
so a pod whose files differ from the plan never starts its engine. A changed
plan changes the ConfigMap's name and the pod template's digest annotation, so
applying it rolls the pod; `kubectl get -L power/plan` shows which plan runs where.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from power.documents.plan import ResolvedPlan, canonical_json
from power.orchestrator.engines import adapter
from power.orchestrator.launch.render import Launch, Listen, engine_launch, with_api_key

PORT = 8080
PLAN_DIR = "/etc/power"
PLAN_FILE = "plan.json"
PREFIX = "power/"
# Labels carry at most 63 characters: a digest prefix there, the full digest in annotations.
LABEL_DIGEST_CHARS = 12
# `.invalid` never resolves (RFC 2606): a dry-run manifest validates, and a cluster refuses to pull it by name.
DRY_RUN_REGISTRY = "dry-run.invalid/power"
GIB = 1024**3
MIB = 1024**2
# What an engine holds beside the mapped model files: HTTP server, tokenizer, buffers, the CUDA context's host side.
ENGINE_OVERHEAD_BYTES = 2 * GIB
STARTUP_SECONDS = 1800  # loading (and for vLLM, compiling) a large model takes minutes
CACHE_DIR = "/cache"
API_KEY_DIR = "/var/run/secrets/power"
API_KEY_ITEM = "api-key"
TOKEN_ITEM = "token"  # the key of a volume's token_secret holding the Hub token


@dataclass(frozen=True)
class ModelMount:
    """The volume holding the model files: its pod volume source, the folder whose copy it holds, where it mounts."""

    source: dict[str, Any]
    local: Path
    mount_path: str
    pull: bool = False  # an init container pulls the plan's artifacts into it before `power verify`
    token_secret: str | None = None  # the Secret whose key TOKEN_ITEM the pull reads as HF_TOKEN


@dataclass(frozen=True)
class ClusterPlacement:
    """Where and how one deployment runs in the cluster (resolved from the fleet or a host file)."""

    key: str
    name: str
    engine: str
    image: str
    verify_image: str
    mount: ModelMount
    node_selector: dict[str, str]
    tolerations: tuple[dict[str, Any], ...] = ()
    fleet: str | None = None
    host: str | None = None
    namespace: str | None = None
    pod_monitor: bool = False
    run_as_user: int = 65532
    dry_run: bool = False
    api_key_secret: str | None = None  # a Secret whose key `api-key` the engine requires of clients
    allow_namespaces: tuple[str, ...] | None = None  # a NetworkPolicy admits only these (and its own namespace)
    # Relative source paths in the carried plan (manifest, profile, findings) are written relative to this folder.
    base_dir: Path = field(default_factory=Path)


def dry_run_image(engine: str) -> str:
    return f"{DRY_RUN_REGISTRY}/{engine}:no-image"


def container_path(mount: ModelMount, path: str) -> str | None:
    """Where the pod sees a planned artifact, or None when it does not lie under the volume's local folder."""
    local, file = Path(mount.local).resolve(), Path(path).resolve()
    if local != file and local not in file.parents:
        return None
    return f"{mount.mount_path.rstrip('/')}/{file.relative_to(local).as_posix()}"


def unmounted_paths(mount: ModelMount, plan: ResolvedPlan) -> list[str]:
    """The plan's artifact paths the pod cannot see: those not under the volume's local folder."""
    paths = [plan.target.path] + [d.path for d in plan.drafters if d.path is not None]
    return [path for path in paths if container_path(mount, path) is None]


def unsourced_paths(plan: ResolvedPlan) -> list[str]:
    """The plan's artifact paths with no source to pull them from."""
    unsourced = [plan.target.path] if plan.target.source is None else []
    return unsourced + [str(d.path) for d in plan.drafters if d.path is not None and d.source is None]


def carried_plan(plan: ResolvedPlan, placement: ClusterPlacement) -> ResolvedPlan:
    """The plan as the pod reads it: artifacts under the mount, source files relative to the fleet; same digest."""
    document = plan.document()
    document["target"]["path"] = container_path(placement.mount, plan.target.path)
    for drafter in document["drafters"]:
        if drafter["path"] is not None:
            drafter["path"] = container_path(placement.mount, drafter["path"])
    for source in document["sources"].values():
        if source is not None:
            source["path"] = _relative(source["path"], placement.base_dir)
    for finding in document["findings"]:
        if finding["file"] is not None:
            finding["file"] = _relative(finding["file"], placement.base_dir)
    return ResolvedPlan.model_validate(document)


def _relative(path: str, base_dir: Path) -> str:
    return Path(os.path.relpath(Path(path).resolve(), Path(base_dir).resolve())).as_posix()


def plan_config_map_name(placement: ClusterPlacement, plan: ResolvedPlan) -> str:
    return f"{placement.name}-plan-{plan.digest[:LABEL_DIGEST_CHARS]}"


def render_objects(plan: ResolvedPlan, placement: ClusterPlacement) -> list[dict[str, Any]]:
    """ConfigMap, Deployment, Service, PodDisruptionBudget (and PodMonitor): plain data in document order."""
    carried = carried_plan(plan, placement)
    objects = [_config_map(carried, placement), _deployment(carried, placement), _service(placement),
               _disruption_budget(placement)]
    if placement.pod_monitor:
        objects.append(_pod_monitor(placement))
    if placement.allow_namespaces is not None:
        objects.append(_network_policy(placement))
    return objects


def objects_digest(objects: list[dict[str, Any]]) -> str:
    """sha256 over the canonical JSON of a deployment's objects: what the fleet lock records and drift compares."""
    return hashlib.sha256(canonical_json(objects)).hexdigest()


def _metadata(placement: ClusterPlacement, name: str, labels: dict[str, str],
              annotations: dict[str, str] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if placement.namespace:
        metadata["namespace"] = placement.namespace
    metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    return metadata


def _selector(placement: ClusterPlacement) -> dict[str, str]:
    return {"app.kubernetes.io/instance": placement.name}


def _labels(placement: ClusterPlacement) -> dict[str, str]:
    labels = {
        "app.kubernetes.io/name": placement.engine,
        **_selector(placement),
        "app.kubernetes.io/component": "inference",
        "app.kubernetes.io/managed-by": "power",
    }
    if placement.fleet:
        labels["app.kubernetes.io/part-of"] = placement.fleet
    if placement.host:
        labels[f"{PREFIX}host"] = placement.host
    labels[f"{PREFIX}engine"] = placement.engine
    return labels


def _plan_labels(placement: ClusterPlacement, plan: ResolvedPlan) -> dict[str, str]:
    return {**_labels(placement), f"{PREFIX}plan": plan.digest[:LABEL_DIGEST_CHARS],
            f"{PREFIX}mode": plan.mode.resolved}


def _plan_annotations(placement: ClusterPlacement, plan: ResolvedPlan) -> dict[str, str]:
    annotations = {f"{PREFIX}deployment": placement.key, f"{PREFIX}plan-digest": plan.digest,
                   f"{PREFIX}plan-name": plan.name}
    if placement.dry_run:
        annotations[f"{PREFIX}dry-run"] = "placeholder images under dry-run.invalid: name real ones before applying"
    return annotations


def _config_map(plan: ResolvedPlan, placement: ClusterPlacement) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(placement, plan_config_map_name(placement, plan), _plan_labels(placement, plan),
                              _plan_annotations(placement, plan)),
        "immutable": True,
        "data": {PLAN_FILE: json.dumps(plan.document(), indent=2, ensure_ascii=False) + "\n"},
    }


def _deployment(plan: ResolvedPlan, placement: ClusterPlacement) -> dict[str, Any]:
    plan_path = f"{PLAN_DIR}/{PLAN_FILE}"
    launch = engine_launch(plan, placement.engine, Path(plan_path), Listen("0.0.0.0", PORT))
    mounts: list[dict[str, Any]] = [
        {"name": "plan", "mountPath": PLAN_DIR, "readOnly": True},
        {"name": "models", "mountPath": placement.mount.mount_path, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "cache", "mountPath": CACHE_DIR},
    ]
    key_env: list[dict[str, Any]] = []
    key_mounts: list[dict[str, Any]] = []
    key_volumes: list[dict[str, Any]] = []
    if placement.api_key_secret is not None:
        launch, key_env, key_mounts, key_volumes = _api_key(launch, placement.engine, placement.api_key_secret)
    writable_env = [{"name": "HOME", "value": "/tmp"}, {"name": "XDG_CACHE_HOME", "value": CACHE_DIR}]
    verify = _init_container(placement, "verify", ["power", "verify", plan_path], writable_env, mounts)
    pulls = [_pull_container(placement, plan_path, writable_env, mounts)] if placement.mount.pull else []
    probe = {"httpGet": {"path": "/health", "port": "http"}}
    engine = {
        "name": "engine",
        "image": placement.image,
        "command": launch.argv,
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "env": [{"name": name, "value": value} for name, value in launch.env.items()] + key_env + writable_env
               + _prebuilt_env(placement.engine),
        "resources": _resources(plan, placement.engine),
        "startupProbe": {**probe, "periodSeconds": 10, "failureThreshold": STARTUP_SECONDS // 10},
        "readinessProbe": {**probe, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**probe, "periodSeconds": 20, "timeoutSeconds": 5, "failureThreshold": 3},
        "securityContext": _container_security(),
        "volumeMounts": mounts + key_mounts,
    }
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "nodeSelector": placement.node_selector,
    }
    if placement.tolerations:
        pod_spec["tolerations"] = list(placement.tolerations)
    pod_spec |= {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": placement.run_as_user,
            "runAsGroup": placement.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "initContainers": [*pulls, verify],
        "containers": [engine],
        "volumes": [
            {"name": "plan", "configMap": {"name": plan_config_map_name(placement, plan)}},
            {"name": "models", **placement.mount.source},
            {"name": "tmp", "emptyDir": {}},
            {"name": "cache", "emptyDir": {}},
            *key_volumes,
        ],
    }
    pod_annotations = {f"{PREFIX}plan-digest": plan.digest, "prometheus.io/scrape": "true",
                       "prometheus.io/port": str(PORT), "prometheus.io/path": "/metrics"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(placement, placement.name, _plan_labels(placement, plan),
                              _plan_annotations(placement, plan) | _prebuilt_annotations(placement.engine)),
        "spec": {
            "replicas": 1,
            "revisionHistoryLimit": 5,
            # One GPU per pod: a surge pod would wait for the device the old pod holds.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": _selector(placement)},
            "template": {
                "metadata": {"labels": _plan_labels(placement, plan), "annotations": pod_annotations},
                "spec": pod_spec,
            },
        },
    }


def _prebuilt_env(engine: str) -> list[dict[str, str]]:
    """The engine pointed at what its image holds ready-made (the writable /cache starts empty in every pod)."""
    prebuilt = adapter(engine).image_prebuilt
    return [] if prebuilt is None else [{"name": prebuilt[0], "value": prebuilt[1]}]


def _prebuilt_annotations(engine: str) -> dict[str, str]:
    prebuilt = adapter(engine).image_prebuilt
    return {} if prebuilt is None else {f"{PREFIX}image-prebuilt": f"the image holds {prebuilt[1]}: {prebuilt[2]}"}


def _init_container(placement: ClusterPlacement, name: str, command: list[str], env: list[dict[str, Any]],
                    mounts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": name,
        "image": placement.verify_image,
        "command": command,
        "env": env,
        "resources": {"requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"memory": "512Mi"}},
        "securityContext": _container_security(),
        "volumeMounts": mounts,
    }


def _pull_container(placement: ClusterPlacement, plan_path: str, env: list[dict[str, Any]],
                    mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """`power pull` on the carried plan (its paths are already where the pod mounts the volume) into the model
    volume, mounted writable here alone: each file is fetched into the volume's partial store (which a restarted
    pod on a claim resumes) and renamed into place, never a second copy. Any refusal exits non-zero, so the pod
    fails before `verify`, and the engine never starts on half a file."""
    writable = [dict(mount, readOnly=False) if mount["name"] == "models" else mount for mount in mounts]
    hub: list[dict[str, Any]] = []
    if placement.mount.token_secret is not None:
        hub.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": placement.mount.token_secret,
                                                                        "key": TOKEN_ITEM}}})
    return _init_container(placement, "pull", ["power", "pull", plan_path], env + hub, writable)


def engine_memory_bytes(plan: ResolvedPlan, engine: str) -> int:
    """The container's memory: the model files plus ENGINE_OVERHEAD_BYTES, and for Power's runtime also the
    plan's own sizing of what the engine holds (it reads each file into memory it owns, `power.runtime.gguf_weights`,
    and builds its weights, KV cache and buffers beside it; on a CPU they are host memory, and while loading on
    a GPU the host stages them). llama-server and vLLM map the files and hold the rest on the device.

    Measured (CPU, float32, Gemma 3 270M Q4_K_M at ctx 2048): `power run` peaks at 1.99 GiB resident; this gives
    3.78 GiB (plan 1.55 GiB + file 0.24 GiB + 2 GiB)."""
    files = plan.target.size + sum(d.size or 0 for d in plan.drafters)
    return files + adapter(engine).host_memory_bytes(plan) + ENGINE_OVERHEAD_BYTES


def _api_key(launch: Launch, engine: str, secret: str) -> tuple[Launch, list[dict[str, Any]], list[dict[str, Any]],
                                                                list[dict[str, Any]]]:
    """The engine requiring the key in `secret`, the engine's own way (its adapter's): a variable set from the
    Secret, else --api-key-file on the Secret mounted read-only. (launch, env, mounts, volumes); the key itself
    never appears in a rendered object."""
    engine_adapter = adapter(engine)
    if engine_adapter.api_key_env is not None:
        reference = {"secretKeyRef": {"name": secret, "key": API_KEY_ITEM}}
        return launch, [{"name": engine_adapter.api_key_env, "valueFrom": reference}], [], []
    if engine_adapter.public_metrics_option is not None:  # Prometheus scrapes without the key
        launch = replace(launch, options=launch.options + ((engine_adapter.public_metrics_option,),))
    mount = {"name": "api-key", "mountPath": API_KEY_DIR, "readOnly": True}
    volume = {
        "name": "api-key",
        "secret": {"secretName": secret, "items": [{"key": API_KEY_ITEM, "path": API_KEY_ITEM}], "defaultMode": 0o440},
    }
    return with_api_key(launch, engine, f"{API_KEY_DIR}/{API_KEY_ITEM}"), [], [mount], [volume]


def _network_policy(placement: ClusterPlacement) -> dict[str, Any]:
    """Ingress to the engine's port from the named namespaces (and the deployment's own) only."""
    allowed = sorted(set(placement.allow_namespaces or ()))
    sources: list[dict[str, Any]] = [{"podSelector": {}}]  # the deployment's own namespace
    if allowed:
        sources.append({"namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": allowed}]}})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(placement, placement.name, _labels(placement)),
        "spec": {
            "podSelector": {"matchLabels": _selector(placement)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": sources, "ports": [{"port": PORT, "protocol": "TCP"}]}],
        },
    }


def _resources(plan: ResolvedPlan, engine: str) -> dict[str, Any]:
    """Memory: `engine_memory_bytes`; CPU: one core per slot and one for the server;
    one GPU per GPU device the plan runs on (a layer split or tensor parallelism takes several)."""
    gpus = sum(1 for device in plan.devices if device.kind == "gpu")
    memory = f"{math.ceil(engine_memory_bytes(plan, engine) / MIB)}Mi"
    requests = {"cpu": str(plan.runtime.slots + 1), "memory": memory}
    limits = {"memory": memory}
    if gpus:
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(gpus)
    return {"requests": requests, "limits": limits}


def _container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _service(placement: ClusterPlacement) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(placement, placement.name, _labels(placement)),
        "spec": {
            "type": "ClusterIP",
            "selector": _selector(placement),
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def _disruption_budget(placement: ClusterPlacement) -> dict[str, Any]:
    # One replica holding a GPU: a voluntary eviction (a drain) waits for the operator; a crashing pod never blocks it.
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(placement, placement.name, _labels(placement)),
        "spec": {
            "maxUnavailable": 0,
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
            "selector": {"matchLabels": _selector(placement)},
        },
    }


def _pod_monitor(placement: ClusterPlacement) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _metadata(placement, placement.name, _labels(placement)),
        "spec": {
            "selector": {"matchLabels": _selector(placement)},
            "podMetricsEndpoints": [{"port": "http", "path": "/metrics"}],
        },
    }
