"""vLLM with a drafter published as a Hugging Face checkpoint (issue 37): a small synthetic DFlash checkpoint on
the loopback Hub (tests/hub_server.py) is pinned and pulled, its config.json read for kind, block size and target,
its tokenizer.json compared with the target GGUF's vocabulary; the plan seals and renders vLLM's
--speculative-config with the pulled folder, and is refused when the tokenizer differs or the engine loads GGUF
drafters only. A GGUF DFlash drafter stays refused on vLLM (PWR463, tests/test_render.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hub_server import Hub, serving, sha256

from power.artifacts.digests import sha256_file
from power.artifacts.factory import build_dense_target
from power.artifacts.facts import inspect_artifact
from power.documents.plan import load_plan
from power.orchestrator.compile import target_vocab
from power.orchestrator.sizing import trunk_layers

POWER = str(Path(sys.executable).parent / "power")
COMMIT = "d" * 40


@pytest.fixture
def hub():
    with serving(Hub()) as hub:
        yield hub


def checkpoint(target: Path, tokens_edit: dict[int, str] | None = None) -> dict[str, bytes]:
    """A DFlash checkpoint for `target`: config.json as the DFlash reference checkpoints write it, the target's
    vocabulary as tokenizer.json (edited where asked), and opaque weights (vLLM's to load, Power's to hash)."""
    facts = inspect_artifact(target)
    vocabulary = facts.tokenizer.vocabulary
    tokens = list(vocabulary.tokens)
    for index, token in (tokens_edit or {}).items():
        tokens[index] = token
    config = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 64,
              "num_hidden_layers": 1, "num_target_layers": len(trunk_layers(facts)), "vocab_size": target_vocab(facts),
              "dflash_config": {"block_size": 8, "target_layer_ids": [1, 2], "mask_token_id": 0}}
    tokenizer = {"version": "1.0", "added_tokens": [],
                 "model": {"type": "BPE", "vocab": {token: index for index, token in enumerate(tokens)},
                           "merges": list(vocabulary.merges)}}
    return {"config.json": json.dumps(config).encode(), "tokenizer.json": json.dumps(tokenizer).encode(),
            "model.safetensors": bytes(range(256)) * 64}


def world(tmp_path: Path, hub: Hub, tokens_edit: dict[int, str] | None = None) -> tuple[Path, Path]:
    """(manifest, profile): the dense fixture target beside the manifest and a DFlash checkpoint on the Hub."""
    target = build_dense_target(tmp_path)
    hub.commit(COMMIT, checkpoint(target, tokens_edit))
    files = "\n".join(f'  {{ name = "{name}" }},' for name in ("config.json", "tokenizer.json", "model.safetensors"))
    manifest = tmp_path / "m.toml"
    manifest.write_text(f'schema = "power.manifest/v1"\nname = "dense-dflash"\n[target]\npath = "{target.name}"\n'
                        f'sha256 = "{sha256_file(target)}"\n\n[[drafters]]\nkind = "dflash"\npath = "dflash-drafter"\n'
                        f'target_sha256 = "{sha256_file(target)}"\nfiles = [\n{files}\n]\n'
                        '[drafters.source]\nrepo = "o/n"\nrevision = "main"\n')
    profile = tmp_path / "p.toml"
    profile.write_text('schema = "power.profile/v1"\nname = "dflash-k4"\nspec_mode = "dflash"\nspec_draft_max = 4\n'
                       'spec_mtp_recurrent_snapshots = 4\n[runtime]\nctx = 2048\n')
    return manifest, profile


def power(hub: Hub, tmp_path: Path, *args: object) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_ENDPOINT": hub.base, "HF_HUB_CACHE": str(tmp_path / "hf-cache"),
           "POWER_CACHE_DIR": str(tmp_path / "power-cache")}
    return subprocess.run([POWER, *map(str, args)], capture_output=True, text=True, env=env, timeout=300)


def test_a_hub_dflash_checkpoint_is_pinned_pulled_planned_and_rendered_for_vllm(tmp_path, hub):
    manifest, profile = world(tmp_path, hub)
    pinned = power(hub, tmp_path, "pull", manifest, "--pin")
    assert pinned.returncode == 0, pinned.stderr
    text = manifest.read_text()
    assert f'revision = "{COMMIT}"' in text
    assert f'sha256 = "{sha256(hub.commits[COMMIT]["config.json"])}"' in text
    assert (tmp_path / "dflash-drafter" / "model.safetensors").read_bytes() == hub.commits[COMMIT]["model.safetensors"]

    plan_path = tmp_path / "plan.json"
    planned = power(hub, tmp_path, "plan", manifest, profile, "--device", "24 GiB", "--engine", "vllm", "-o", plan_path)
    assert planned.returncode == 0, planned.stderr
    drafter = load_plan(plan_path).drafters[0]
    assert (drafter.kind, drafter.contract["format"], drafter.contract["block_size"]) == ("dflash", "checkpoint", 8)
    assert [f.name for f in drafter.files] == ["config.json", "tokenizer.json", "model.safetensors"]
    assert drafter.source.label == f"hf://o/n@{COMMIT}"

    rendered = power(hub, tmp_path, "render", plan_path, "--target", "vllm")
    assert rendered.returncode == 0, rendered.stderr
    config = json.loads(next(line for line in rendered.stdout.splitlines() if "--speculative-config" in line)
                        .split("--speculative-config", 1)[1].strip().rstrip("\\").strip().strip("'"))
    assert config == {"method": "dflash", "model": str(tmp_path / "dflash-drafter"), "num_speculative_tokens": 4}

    verified = power(hub, tmp_path, "verify", plan_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"from hf://o/n@{COMMIT}/model.safetensors" in verified.stdout

    (tmp_path / "dflash-drafter" / "model.safetensors").write_bytes(b"\0" * (256 * 64))
    assert power(hub, tmp_path, "verify", plan_path).returncode == 1


def test_a_checkpoint_whose_tokenizer_differs_is_refused(tmp_path, hub):
    manifest, profile = world(tmp_path, hub, tokens_edit={5: "<not-the-target's>"})
    assert power(hub, tmp_path, "pull", manifest, "--pin").returncode == 0
    refused = power(hub, tmp_path, "plan", manifest, profile, "--device", "24 GiB", "--engine", "vllm", "--json")
    assert refused.returncode == 1
    [finding] = [f for f in json.loads(refused.stdout)["findings"] if f["severity"] == "error"]
    assert finding["code"] == "PWR310" and "token at id 5" in finding["message"]


def test_a_checkpoint_drafter_is_refused_by_engines_that_load_gguf_drafters(tmp_path, hub):
    manifest, profile = world(tmp_path, hub)
    assert power(hub, tmp_path, "pull", manifest, "--pin").returncode == 0
    for engine in ("llama-server", "power"):
        refused = power(hub, tmp_path, "plan", manifest, profile, "--device", "24 GiB", "--engine", engine, "--json")
        assert refused.returncode == 1
        assert "PWR463" in [f["code"] for f in json.loads(refused.stdout)["findings"]], refused.stderr


def test_a_checkpoint_built_for_another_target_or_of_another_kind_is_refused(tmp_path, hub):
    manifest, profile = world(tmp_path, hub)
    config = json.loads(hub.commits[COMMIT]["config.json"])
    hub.commits[COMMIT]["config.json"] = json.dumps(config | {"num_target_layers": 99}).encode()
    assert power(hub, tmp_path, "pull", manifest, "--pin").returncode == 0
    refused = power(hub, tmp_path, "plan", manifest, profile, "--device", "24 GiB", "--engine", "vllm", "--json")
    assert refused.returncode == 1 and "PWR211" in refused.stdout
    (tmp_path / "dflash-drafter" / "config.json").write_text(json.dumps(config | {"architectures": ["Eagle3Model"]}))
    manifest.write_text(manifest.read_text().replace(sha256(hub.commits[COMMIT]["config.json"]),
                                                     sha256_file(tmp_path / "dflash-drafter" / "config.json"))
                        .replace(f"size = {len(hub.commits[COMMIT]['config.json'])}",
                                 f"size = {(tmp_path / 'dflash-drafter' / 'config.json').stat().st_size}"))
    other = power(hub, tmp_path, "plan", manifest, profile, "--device", "24 GiB", "--engine", "vllm", "--json")
    assert other.returncode == 1 and "PWR210" in other.stdout, other.stdout


def test_checkpoint_entries_are_checked_as_the_manifest_is_read(tmp_path, hub):
    manifest, _ = world(tmp_path, hub)
    text = manifest.read_text()
    refused = power(hub, tmp_path, "validate", manifest, "--json")
    assert refused.returncode == 1 and {"PWR131", "PWR132"} <= set(refused.stdout.split('"')), refused.stdout
    manifest.write_text(text.replace('  { name = "config.json" },\n', "").replace('revision = "main"', f'revision = "{COMMIT}"'))
    no_config = power(hub, tmp_path, "validate", manifest)
    assert no_config.returncode == 1 and "must include config.json" in no_config.stdout + no_config.stderr


def test_k_past_the_checkpoints_block_is_refused(tmp_path, hub):
    manifest, profile = world(tmp_path, hub)
    assert power(hub, tmp_path, "pull", manifest, "--pin").returncode == 0
    profile.write_text(profile.read_text().replace("spec_draft_max = 4", "spec_draft_max = 8")
                       .replace("spec_mtp_recurrent_snapshots = 4", "spec_mtp_recurrent_snapshots = 8"))
    refused = power(hub, tmp_path, "plan", manifest, profile, "--device", "24 GiB", "--engine", "vllm", "--json")
    assert refused.returncode == 1 and "PWR425" in refused.stdout and "block_size 8" in refused.stdout


def test_the_sealed_plan_pulls_the_checkpoint_into_an_empty_folder_that_verifies(tmp_path, hub):
    """What the Kubernetes pull init container does for a vLLM pod: `power pull PLAN` into the mounted folder."""
    manifest, profile = world(tmp_path, hub)
    assert power(hub, tmp_path, "pull", manifest, "--pin").returncode == 0
    plan_path = tmp_path / "plan.json"
    assert power(hub, tmp_path, "plan", manifest, profile, "--device", "24 GiB", "--engine", "vllm", "-o",
                 plan_path).returncode == 0
    models = tmp_path / "models"
    models.mkdir()
    (models / "dense-target.gguf").write_bytes((tmp_path / "dense-target.gguf").read_bytes())
    pulled = power(hub, tmp_path, "pull", plan_path, "-o", models)
    assert pulled.returncode == 0, pulled.stderr
    assert (models / "dflash-drafter" / "tokenizer.json").read_bytes() == hub.commits[COMMIT]["tokenizer.json"]
    verified = power(hub, tmp_path, "verify", plan_path, "--root", models)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert power(hub, tmp_path, "pull", plan_path, "--pin").returncode == 2
