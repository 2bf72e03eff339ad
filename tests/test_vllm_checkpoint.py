"""vLLM with a drafter published as a Hugging Face checkpoint (issue 37): a small synthetic DFlash or EAGLE-3
checkpoint on the loopback Hub (tests/hub_server.py) is pinned and pulled, its config.json read for kind, block
size and target, its tokenizer.json compared with the target GGUF's vocabulary; the plan seals, sizes and renders
vLLM's --speculative-config with the pulled folder, and is refused when the tokenizer or the target differs or the
engine loads GGUF drafters only; `power import vllm` carries an EAGLE-3 launch into manifest and profile. A GGUF
DFlash drafter stays refused on vLLM (PWR463, tests/test_render.py)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from hub_server import Hub, serving, sha256

from power.artifacts.digests import sha256_file
from power.artifacts.factory import build_dense_target, build_gemma3_target
from power.artifacts.facts import inspect_artifact
from power.documents.plan import load_plan
from power.orchestrator.engines.sizing import trunk_layers, whole
from power.orchestrator.planning.compile import target_vocab

POWER = str(Path(sys.executable).parent / "power")
COMMIT = "d" * 40


@pytest.fixture
def hub():
    with serving(Hub()) as hub:
        yield hub


def checkpoint(target: Path, tokens_edit: dict[int, str] | None = None, kind: str = "dflash",
               config_edit: dict | None = None) -> dict[str, bytes]:
    """A `kind` checkpoint for `target`: config.json as the reference checkpoints write it, the target's vocabulary
    as tokenizer.json (edited where asked), and weights in a safetensors file (vLLM's to load, Power's to hash and
    size)."""
    facts = inspect_artifact(target)
    vocabulary = facts.tokenizer.vocabulary
    tokens = list(vocabulary.tokens)
    for index, token in (tokens_edit or {}).items():
        tokens[index] = token
    layers, width = len(trunk_layers(facts)), whole(facts.hparam("embedding_length"))
    config = {"dflash": {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 64,
                         "num_hidden_layers": 1, "num_target_layers": layers, "vocab_size": target_vocab(facts),
                         "dflash_config": {"block_size": 8, "target_layer_ids": [1, 2], "mask_token_id": 0}},
              # as vLLM reads an EAGLE-3 checkpoint (vllm/model_executor/models/llama_eagle3.py)
              "eagle3": {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": width,
                         "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                         "vocab_size": target_vocab(facts), "draft_vocab_size": 32, "target_hidden_size": width,
                         "eagle_aux_hidden_state_layer_ids": [0, layers // 2, layers - 1]}}[kind]
    tokenizer = {"version": "1.0", "added_tokens": [],
                 "model": {"type": "BPE", "vocab": {token: index for index, token in enumerate(tokens)},
                           "merges": list(vocabulary.merges)}}
    return {"config.json": json.dumps(config | (config_edit or {})).encode(),
            "tokenizer.json": json.dumps(tokenizer).encode(),
            "model.safetensors": safetensors({"fc.weight": (64, 192)})}


def safetensors(tensors: dict[str, tuple[int, int]]) -> bytes:
    """A safetensors file of zeroed F16 tensors: its 8-byte header length, its JSON header, the data."""
    header, offset = {}, 0
    for name, shape in tensors.items():
        size = shape[0] * shape[1] * 2
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + bytes(offset)


def world(tmp_path: Path, hub: Hub, tokens_edit: dict[int, str] | None = None, kind: str = "dflash",
          config_edit: dict | None = None, build_target=build_dense_target) -> tuple[Path, Path]:
    """(manifest, profile): a fixture target (the dense one unless told) beside the manifest and a `kind`
    checkpoint for it on the Hub."""
    target = build_target(tmp_path)
    hub.commit(COMMIT, checkpoint(target, tokens_edit, kind, config_edit))
    files = "\n".join(f'  {{ name = "{name}" }},' for name in ("config.json", "tokenizer.json", "model.safetensors"))
    manifest = tmp_path / "m.toml"
    manifest.write_text(f'schema = "power.manifest/v1"\nname = "dense-{kind}"\n[target]\npath = "{target.name}"\n'
                        f'sha256 = "{sha256_file(target)}"\n\n[[drafters]]\nkind = "{kind}"\npath = "{kind}-drafter"\n'
                        f'target_sha256 = "{sha256_file(target)}"\nfiles = [\n{files}\n]\n'
                        '[drafters.source]\nrepo = "o/n"\nrevision = "main"\n')
    profile = tmp_path / "p.toml"
    profile.write_text(f'schema = "power.profile/v1"\nname = "{kind}-k4"\nspec_mode = "{kind}"\nspec_draft_max = 4\n'
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
    manifest.write_text(
        text.replace('  { name = "config.json" },\n', "").replace('revision = "main"', f'revision = "{COMMIT}"')
    )
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


# The speculators format (github.com/vllm-project/speculators), which vLLM also loads: the layer's keys nested.
SPECULATORS = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
               "transformer_layer_config": {"num_hidden_layers": 1, "num_attention_heads": 4,
                                            "num_key_value_heads": 1, "head_dim": 16}}


@pytest.mark.parametrize(("edit", "architecture", "kv_heads"), [
    ({}, "LlamaForCausalLMEagle3", 2), (SPECULATORS, "Eagle3Speculator", 1)])
def test_a_hub_eagle3_checkpoint_is_pulled_planned_sized_and_rendered_for_vllm(tmp_path, hub, edit, architecture,
                                                                                kv_heads):
    manifest, profile = world(tmp_path, hub, kind="eagle3", config_edit=edit)
    assert power(hub, tmp_path, "pull", manifest, "--pin").returncode == 0
    plan_path = tmp_path / "plan.json"
    planned = power(hub, tmp_path, "plan", manifest, profile, "--device", "24 GiB", "--engine", "vllm", "-o", plan_path)
    assert planned.returncode == 0, planned.stderr
    plan = load_plan(plan_path)
    drafter = plan.drafters[0]
    layers = len(trunk_layers(inspect_artifact(tmp_path / "dense-target.gguf")))
    assert drafter.kind == "eagle3" and drafter.contract["architecture"] == architecture
    assert (drafter.contract["draft_vocab_size"], drafter.contract["target_layer_ids"]) == (32, (0, layers // 2,
                                                                                                 layers - 1))
    components = {c.name: c for c in plan.memory.devices[0].components}
    weights = len(hub.commits[COMMIT]["model.safetensors"])
    assert components["drafter weights"].bytes == weights
    layers_heads_dim_kv_bytes = 1 * kv_heads * 16 * 2 * 2  # one layer, its KV heads x 16, K and V, 16-bit
    assert (
        components["drafter KV"].bytes
        == layers_heads_dim_kv_bytes * plan.memory.slots.ctx_per_slot * plan.runtime.slots
    )

    rendered = power(hub, tmp_path, "render", plan_path, "--target", "vllm")
    assert rendered.returncode == 0, rendered.stderr
    config = json.loads(next(line for line in rendered.stdout.splitlines() if "--speculative-config" in line)
                        .split("--speculative-config", 1)[1].strip().rstrip("\\").strip().strip("'"))
    assert config == {"method": "eagle3", "model": str(tmp_path / "eagle3-drafter"), "num_speculative_tokens": 4}
    assert power(hub, tmp_path, "verify", plan_path).returncode == 0


@pytest.mark.parametrize(("edit", "says"), [
    ({"target_hidden_size": 96}, "hidden size (target_hidden_size)"),
    ({"eagle_aux_hidden_state_layer_ids": [0, 1, 9]}, "reads the hidden states of target layers [0, 1, 9]"),
    ({"eagle_aux_hidden_state_layer_ids": [0, 1]}, "vLLM's EAGLE-3 fuses 3"),
    ({"draft_vocab_size": 1 << 20}, "exceeds its vocab_size"),
])
def test_an_eagle3_checkpoint_built_for_another_target_is_refused(tmp_path, hub, edit, says):
    manifest, profile = world(tmp_path, hub, kind="eagle3", config_edit=edit)
    assert power(hub, tmp_path, "pull", manifest, "--pin").returncode == 0
    refused = power(hub, tmp_path, "plan", manifest, profile, "--device", "24 GiB", "--engine", "vllm", "--json")
    assert refused.returncode == 1
    [finding] = [f for f in json.loads(refused.stdout)["findings"] if f["severity"] == "error"]
    assert finding["code"] == "PWR211" and says in finding["message"], finding


def test_an_eagle3_checkpoint_whose_tokenizer_differs_is_refused(tmp_path, hub):
    manifest, profile = world(tmp_path, hub, tokens_edit={7: "<not-the-target's>"}, kind="eagle3")
    assert power(hub, tmp_path, "pull", manifest, "--pin").returncode == 0
    refused = power(hub, tmp_path, "plan", manifest, profile, "--device", "24 GiB", "--engine", "vllm", "--json")
    assert refused.returncode == 1 and "PWR310" in refused.stdout and "token at id 7" in refused.stdout


def test_eagle3_runs_on_vllm_only_and_only_as_a_checkpoint(tmp_path, hub):
    manifest, profile = world(tmp_path, hub, kind="eagle3")
    assert power(hub, tmp_path, "pull", manifest, "--pin").returncode == 0
    for engine, why in (("llama-server", "llama.cpp's draft-eagle3 loads a GGUF"),
                        ("power", "Power's runtime has no speculator for eagle3")):
        refused = power(hub, tmp_path, "plan", manifest, profile, "--device", "24 GiB", "--engine", engine, "--json")
        findings = json.loads(refused.stdout)["findings"]
        assert refused.returncode == 1 and {"PWR460", "PWR463"} <= {f["code"] for f in findings}
        assert any(why in f["message"] for f in findings), findings
    text = manifest.read_text()
    manifest.write_text(text[:text.index("files = [")] + 'sha256 = "' + "0" * 64 + '"\n')
    as_gguf = power(hub, tmp_path, "validate", manifest, "--json")
    assert as_gguf.returncode == 1 and "lists no `files`" in as_gguf.stdout


def test_vllm_refuses_eagle3_against_a_target_model_type_it_does_not_run_it_for(tmp_path, hub):
    manifest, profile = world(tmp_path, hub, kind="eagle3", build_target=build_gemma3_target)
    assert power(hub, tmp_path, "pull", manifest, "--pin").returncode == 0
    refused = power(hub, tmp_path, "plan", manifest, profile, "--device", "24 GiB", "--engine", "vllm", "--json")
    [finding] = [f for f in json.loads(refused.stdout)["findings"] if f["severity"] == "error"]
    assert refused.returncode == 1 and finding["code"] == "PWR460" and "this target is gemma3" in finding["message"]


def test_a_vllm_eagle3_launch_line_imports_into_manifest_and_profile(tmp_path, hub):
    target = build_dense_target(tmp_path)
    folder = tmp_path / "eagle3"
    folder.mkdir()
    for name, data in checkpoint(target, kind="eagle3").items():
        (folder / name).write_bytes(data)
    out = tmp_path / "imported"
    config = json.dumps({"method": "eagle3", "model": str(folder), "num_speculative_tokens": 3})
    imported = power(hub, tmp_path, "import", "vllm", "-o", out, "--device", "24 GiB", "--", "vllm", "serve", target,
                     "--max-model-len", "2048", "--speculative-config", config)
    assert imported.returncode == 0, imported.stdout + imported.stderr
    manifest = tomllib.loads((out / "manifest.toml").read_text())
    [drafter] = manifest["drafters"]
    assert drafter["kind"] == "eagle3" and (out / drafter["path"]).resolve() == folder
    assert {f["name"]: f["sha256"] for f in drafter["files"]} == {
        name: sha256_file(folder / name) for name in ("config.json", "model.safetensors", "tokenizer.json")}
    profile = tomllib.loads((out / "profile.toml").read_text())
    assert (profile["spec_mode"], profile["engine"], profile["spec_draft_max"]) == ("eagle3", "vllm", 3)
