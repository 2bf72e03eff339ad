"""The Kubernetes render with pulling on: an init container runs `power pull` on the carried plan into the model
volume (an emptyDir here) before `power verify`, so a fleet needs no pre-filled volume. The rendered objects pass
the pinned Kubernetes schemas, and the init containers' exact commands run against a loopback Hub into an empty
folder (tests/hub_server.py; no network)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner
from fleet_world import build_world, kubernetes_host, write
from hub_server import Hub, serving, sha256

from power.app.cli import main
from power.orchestrator.kubernetes.objects import PLAN_DIR, PLAN_FILE

KUBERNETES_VERSION = "1.33.0"
COMMIT = "c" * 40
POWER = [sys.executable, "-c", "from power.app.cli import main; main()"]


def run(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def hub():
    with serving(Hub()) as hub:
        yield hub


def pulling_fleet(tmp_path: Path, hub: Hub, sourced: bool = True) -> tuple[Path, Path]:
    """A fleet whose dense target is published on the loopback Hub, on a volume the pod fills: (fleet, mount)."""
    world = build_world(tmp_path)
    target = next((tmp_path / "artifacts").glob("*dense*.gguf"))
    hub.commit(COMMIT, {target.name: target.read_bytes()})
    source = f'[target.source]\nrepo = "o/n"\nrevision = "{COMMIT}"\n' if sourced else ""
    write(tmp_path / "manifests" / "published.toml", f'schema = "power.manifest/v1"\nname = "published"\n[target]\n'
          f'path = "../artifacts/{target.name}"\nsize = {target.stat().st_size}\nsha256 = '
          f'"{sha256(target.read_bytes())}"\n{source}[[drafters]]\nkind = "ngram"\n')
    mount = tmp_path / "pod" / "models"
    fleet = world.fleet(f'''
        [[hosts]]
        name = "gpu-1"
        devices = [{{ model = "RTX 4090", vram = "24 GiB" }}]
        [hosts.kubernetes]
        node_name = "gpu-1"
        [kubernetes]
        images = {{ power = "registry.example.com/power:1", llama-server = "registry.example.com/llama:1" }}
        [kubernetes.volumes.models]
        empty_dir = true
        pull = true
        local = "artifacts"
        mount_path = "{mount}"
        ''', '''
        [[deployments]]
        host = "gpu-1"
        manifest = "manifests/published.toml"
        profile = "profiles/ngram.toml"
        engine = "llama-server"
        ''')
    return fleet, mount


def rendered_pod(tmp_path: Path, fleet: Path) -> tuple[list[dict], dict]:
    tree = tmp_path / "k8s"
    result = run("fleet", "render", fleet, "--target", "kubernetes", "-o", tree)
    assert result.exit_code == 0, result.output
    folder = tree / "base" / "gpu-1-published"
    documents = [
        yaml.safe_load(path.read_text()) for path in sorted(folder.glob("*.yaml")) if path.name != "kustomization.yaml"
    ]
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    return documents, deployment["spec"]["template"]["spec"]


def in_pod(tmp_path: Path, documents: list[dict], container: dict) -> tuple[list[str], dict[str, str]]:
    """The container's command with the plan's ConfigMap laid out where it mounts, and its environment."""
    config_map = next(d for d in documents if d["kind"] == "ConfigMap")
    plan = tmp_path / "pod" / PLAN_DIR.lstrip("/") / PLAN_FILE
    plan.parent.mkdir(parents=True, exist_ok=True)
    plan.write_text(config_map["data"][PLAN_FILE])
    command = [str(plan) if word == f"{PLAN_DIR}/{PLAN_FILE}" else word for word in container["command"]]
    return command, {item["name"]: item["value"] for item in container["env"]}


def test_the_pull_init_container_fills_an_empty_volume_and_verify_passes(tmp_path, hub):
    fleet, mount = pulling_fleet(tmp_path, hub)
    documents, pod = rendered_pod(tmp_path, fleet)
    for document in documents:
        assert kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    pull, verify = pod["initContainers"]
    assert (pull["name"], verify["name"]) == ("pull", "verify")
    assert {m["name"]: m["readOnly"] for m in pull["volumeMounts"] if m["name"] in ("models", "plan")} == \
        {"models": False, "plan": True}
    assert all(m["readOnly"] for m in [*verify["volumeMounts"], *pod["containers"][0]["volumeMounts"]]
               if m["name"] == "models")
    assert {"name": "models", "emptyDir": {}} in pod["volumes"]

    command, env = in_pod(tmp_path, documents, pull)
    assert command[:2] == ["power", "pull"] and not mount.exists()
    pod_env = {**os.environ, **env, "HF_ENDPOINT": hub.base, "HF_HUB_CACHE": str(tmp_path / "hf-cache"),
               "POWER_CACHE_DIR": str(tmp_path / "power-cache")}
    pulled = subprocess.run(POWER + command[1:], capture_output=True, text=True, env=pod_env, timeout=120)
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    verify_command, _ = in_pod(tmp_path, documents, verify)
    verified = subprocess.run(POWER + verify_command[1:], capture_output=True, text=True, env=pod_env, timeout=120)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"from hf://o/n@{COMMIT}/" in verified.stdout


def test_a_tampered_download_fails_the_pull_and_leaves_the_volume_without_the_file(tmp_path, hub):
    fleet, mount = pulling_fleet(tmp_path, hub)
    documents, pod = rendered_pod(tmp_path, fleet)
    [name] = hub.commits[COMMIT]
    data = bytearray(hub.commits[COMMIT][name])
    data[-1] ^= 0xFF
    hub.served[name] = bytes(data)
    command, env = in_pod(tmp_path, documents, pod["initContainers"][0])
    pod_env = {**os.environ, **env, "HF_ENDPOINT": hub.base, "HF_HUB_CACHE": str(tmp_path / "hf-cache"),
               "POWER_CACHE_DIR": str(tmp_path / "power-cache")}
    pulled = subprocess.run(POWER + command[1:], capture_output=True, text=True, env=pod_env, timeout=120)
    assert pulled.returncode == 1 and "PWR136" in pulled.stderr
    assert not (mount / name).exists()


def test_pulling_an_artifact_without_a_source_is_a_review_finding(tmp_path, hub):
    fleet, _ = pulling_fleet(tmp_path, hub, sourced=False)
    result = run("fleet", "render", fleet, "--target", "kubernetes", "-o", tmp_path / "k8s")
    assert result.exit_code == 1 and "PWR140" in result.output and not (tmp_path / "k8s").exists()


def test_an_empty_dir_without_pull_is_refused(tmp_path, hub):
    fleet, _ = pulling_fleet(tmp_path, hub)
    fleet.write_text(fleet.read_text().replace("pull = true\n", ""))
    result = run("fleet", "review", fleet)
    assert result.exit_code == 1 and "set pull = true" in result.output


def test_a_plan_renders_alone_with_pulling_on(tmp_path, hub):
    pulling_fleet(tmp_path, hub)
    host = kubernetes_host(tmp_path / "host.toml")
    plans = {}
    for name in ("published", "dense"):
        plans[name] = tmp_path / f"{name}.plan.json"
        assert run("plan", tmp_path / "manifests" / f"{name}.toml", tmp_path / "profiles" / "ngram.toml", "--host",
                   host, "-o", plans[name]).exit_code == 0
    result = run("render", plans["published"], "--target", "kubernetes", "--host", host, "--models-claim", "models",
                 "--models-pull", "--models-token-secret", "hf-token")
    assert result.exit_code == 0, result.output
    documents = list(yaml.safe_load_all(result.output))
    for document in documents:
        assert kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    pod = documents[1]["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["pull", "verify"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}} in \
        pod["initContainers"][0]["env"]
    assert not any(e["name"] == "HF_TOKEN" for c in [pod["initContainers"][1], *pod["containers"]] for e in c["env"])
    assert {"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": False}} in pod["volumes"]
    unsourced = run("render", plans["dense"], "--target", "kubernetes", "--host", host, "--models-empty-dir",
                    "--models-pull")
    assert unsourced.exit_code == 1 and "PWR140" in unsourced.output
    no_pull = run("render", plans["published"], "--target", "kubernetes", "--host", host, "--models-empty-dir")
    assert no_pull.exit_code == 2 and "set pull = true" in no_pull.output
    stray = run("render", plans["published"], "--target", "kubernetes", "--host", host, "--models-claim", "models",
                "--models-token-secret", "hf-token")
    assert stray.exit_code == 2 and "token_secret is the pull's Hub token" in stray.output
