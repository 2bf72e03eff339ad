"""The rendered tree: a kustomize base with every deployment, and one overlay per applied rollout stage.

    base/kustomization.yaml          every deployment's objects, as the fleet file plans them
    base/<name>/plan.yaml            the plan's ConfigMap (deployment.yaml, service.yaml, pdb.yaml, podmonitor.yaml)
    stages/<stage>/kustomization.yaml  the base, the candidate plans' ConfigMaps, and JSON 6902 patches
    stages/<stage>/<name>.*            moving each deployment of this and every earlier stage to its candidate

`kubectl apply -k stages/canary` is the canary stage; `kubectl apply -k base`
is the fleet as planned (and a rollback). An overlay exists only for a stage
`power rollout advance` opened, so only evidence-gated stages reach a cluster.
Each patch first tests the base's plan digest, so a stage built over a base
of other plans fails in `kubectl kustomize` instead of mixing them.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from power.artifacts.atomic import new_mode
from power.documents.plan import ResolvedPlan
from power.findings import Finding, Severity
from power.orchestrator.kubernetes.objects import PREFIX, ClusterPlacement, render_objects

KUSTOMIZATION = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization"}
FILE_NAMES = {"ConfigMap": "plan", "Deployment": "deployment", "Service": "service",
              "PodDisruptionBudget": "pdb", "PodMonitor": "podmonitor", "NetworkPolicy": "networkpolicy"}


@dataclass
class Stage:
    """An applied rollout stage: its name and, for it and every earlier stage, each deployment's candidate plan."""

    name: str
    candidates: dict[str, ResolvedPlan] = field(default_factory=dict)


def yaml_text(*documents: object) -> str:
    """Plain YAML documents (`---` between them); multi-line strings as literal blocks, so the plan reads as JSON."""
    import yaml  # here, not at import: `power <command> --help` and the commands that write no YAML never load it

    return "---\n".join(yaml.dump(document, Dumper=_dumper(), sort_keys=False, allow_unicode=True, width=4096)
                        for document in documents)


def yaml_comment(text: str) -> str:
    """One YAML comment line holding `text`, whatever it holds: every character YAML could read as a line break
    (\\n, \\r, NEL, U+2028, U+2029) and every other unprintable one is written as an escape, so a fleet or deployment
    name can never end the comment and start YAML of its own."""
    escaped = "".join(ch if ch.isprintable() and ch != "\\" else ("\\\\" if ch == "\\" else f"\\u{ord(ch):04x}")
                      for ch in text)
    return f"# {escaped}\n"


@functools.cache
def _dumper() -> type:
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, _data: Any) -> bool:
            return True  # objects share sub-dicts (the mounts of both containers); a manifest spells each out

    def string(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, string)
    return Dumper


def build_tree(plans: dict[str, ResolvedPlan], placements: dict[str, ClusterPlacement], stages: list[Stage],
               header: str) -> dict[str, str]:
    """{relative path: text} of the whole tree, computed before anything is written."""
    files: dict[str, str] = {}
    base_objects = {key: render_objects(plans[key], placements[key]) for key in placements}
    resources = []
    for key, objects in base_objects.items():
        name = placements[key].name
        for obj in objects:
            path = f"{name}/{FILE_NAMES[obj['kind']]}.yaml"
            files[f"base/{path}"] = yaml_text(obj)
            resources.append(path)
    files["base/kustomization.yaml"] = yaml_comment(header) + yaml_text({**KUSTOMIZATION, "resources": resources})
    for stage in stages:
        files |= _overlay(stage, base_objects, placements, header)
    return files


def _overlay(stage: Stage, base_objects: dict[str, list[dict[str, Any]]], placements: dict[str, ClusterPlacement],
             header: str) -> dict[str, str]:
    files: dict[str, str] = {}
    resources = ["../../base"]
    patches = []
    for key, plan in stage.candidates.items():
        placement = placements[key]
        base = {(obj["kind"], obj["metadata"]["name"]): obj for obj in base_objects[key]}
        for obj in render_objects(plan, placement):
            kind, name = obj["kind"], obj["metadata"]["name"]
            if (kind, name) not in base:
                path = f"{placement.name}.{FILE_NAMES[kind]}.yaml"
                files[f"stages/{stage.name}/{path}"] = yaml_text(obj)
                resources.append(path)
                continue
            operations = json_patch(base[(kind, name)], obj)
            if not operations:
                continue
            path = f"{placement.name}.{FILE_NAMES[kind]}.patch.yaml"
            guard = _digest_guard(base[(kind, name)])
            files[f"stages/{stage.name}/{path}"] = yaml_text(guard + operations)
            patches.append({"path": path, "target": _target(obj)})
    document = {**KUSTOMIZATION, "resources": resources, "patches": patches}
    comment = yaml_comment(header) + yaml_comment(
        f"Stage {stage.name}: {', '.join(stage.candidates)} on the candidate plans. "
        "Apply with `kubectl apply -k` on this folder; `kubectl apply -k ../../base` undoes it.")
    files[f"stages/{stage.name}/kustomization.yaml"] = comment + yaml_text(document)
    return files


def _target(obj: dict[str, Any]) -> dict[str, str]:
    group, _, version = obj["apiVersion"].rpartition("/")
    target = {"group": group, "version": version, "kind": obj["kind"], "name": obj["metadata"]["name"]}
    if "namespace" in obj["metadata"]:
        target["namespace"] = obj["metadata"]["namespace"]
    return target


def _digest_guard(base: dict[str, Any]) -> list[dict[str, Any]]:
    digest = base["metadata"].get("annotations", {}).get(f"{PREFIX}plan-digest")
    if digest is None:
        return []
    return [{"op": "test", "path": "/metadata/annotations/" + _escape(f"{PREFIX}plan-digest"), "value": digest}]


def json_patch(old: Any, new: Any, path: str = "") -> list[dict[str, Any]]:
    """RFC 6902 operations turning `old` into `new`: maps key by key, lists of maps item by item when their
    lengths agree, any other changed list or value replaced whole (so a patch shows whole argument lists)."""
    if isinstance(old, dict) and isinstance(new, dict):
        operations = [{"op": "remove", "path": f"{path}/{_escape(key)}"} for key in old if key not in new]
        for key, value in new.items():
            if key not in old:
                operations.append({"op": "add", "path": f"{path}/{_escape(key)}", "value": value})
            else:
                operations += json_patch(old[key], value, f"{path}/{_escape(key)}")
        return operations
    if (isinstance(old, list) and isinstance(new, list) and len(old) == len(new)
            and all(isinstance(item, dict) for item in old + new)):
        return [
            op for index, (a, b) in enumerate(zip(old, new, strict=True)) for op in json_patch(a, b, f"{path}/{index}")
        ]
    return [] if old == new else [{"op": "replace", "path": path, "value": new}]


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


# Written into every rendered tree: only a folder that holds it (or a new or empty one) is ever replaced.
RENDER_MARKER = ".power-render"
_MARKER_TEXT = "This folder was written by `power fleet render`; the next render replaces it whole.\n"


def write_tree(directory: Path, files: dict[str, str]) -> None:
    """Replace `directory` with exactly `files` and the render marker: written beside it first, then swapped in
    by renames. The caller has checked that `directory` is replaceable (`power.app.outputs.replaceable_tree`)."""
    directory = Path(directory).absolute()
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        for relative, text in {**files, RENDER_MARKER: _MARKER_TEXT}.items():
            path = staging / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        os.chmod(staging, new_mode(executable=True))  # a directory as mkdir makes it: 0777 less the umask
        retired = None
        if directory.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old.", dir=directory.parent))
            os.rename(directory, retired / directory.name)
        os.rename(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if retired is not None:
        shutil.rmtree(retired, ignore_errors=True)


def tree_finding(message: str, hint: str, file: str) -> Finding:
    return Finding(code="PWR095", severity=Severity.ERROR, message=message, file=file, hint=hint)
