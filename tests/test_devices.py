"""Several devices for one deployment: a layer split that fits where one device does not, vLLM tensor parallelism,
the renders that carry them, fleet deployments spanning devices, and the located findings for bad split settings."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType as Q
from plan_helpers import codes, digest

from power.app.cli import main
from power.artifacts import factory
from power.documents.plan import load_plan
from power.orchestrator.inputs.loading import load_profile

# A llama-shaped header of 337 MB (16 layers, 16 heads, 8 KV heads): more than one 720 MiB GPU holds beside its CUDA
# context, less than two.
MID = factory.DenseConfig(d_model=1024, n_layers=16, n_heads=16, n_kv_heads=8, head_dim=64, ffn=4096, vocab=32000,
                          ctx=8192)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    shapes = {n: s for n, s in factory.dense_tensor_shapes(MID).items() if "q_norm" not in n and "k_norm" not in n}
    tensors = {n: (s, Q.F32 if len(s) == 1 else Q.Q8_0) for n, s in shapes.items()}
    metadata = factory.dense_metadata(MID, "llama", "mid", 7) | {"llama.vocab_size": MID.vocab}
    return factory.write_sparse_gguf(tmp_path_factory.mktemp("mid") / "mid.gguf", "llama", metadata, tensors)


@pytest.fixture()
def files(tmp_path, model):
    manifest = tmp_path / "mid.manifest.toml"
    manifest.write_text(f'schema = "power.manifest/v1"\nname = "mid"\n[target]\npath = "{model}"\n'
                        f'sha256 = "{digest(model)}"\n')
    host = tmp_path / "pair.host.toml"
    host.write_text('schema = "power.host/v1"\nname = "pair"\nheadroom = "16 MiB"\n'
                    'devices = [{ model = "GPU A", vram = "720 MiB" }, { model = "GPU B", vram = "720 MiB" },\n'
                    '           { model = "GPU C", vram = "720 MiB" }, { model = "host CPU", vram = "8 '
                    'GiB", kind = "cpu" }]\n')
    return tmp_path, manifest, host


def profile(directory: Path, name: str = "split", **runtime) -> Path:
    lines = ['schema = "power.profile/v1"', f'name = "{name}"', 'spec_mode = "none"', "[runtime]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in ({"ctx": 4096, "flash_attn": True} | runtime).items()]
    path = directory / f"{name}.profile.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def invoke(*args) -> object:
    return CliRunner().invoke(main, [str(a) for a in args])


def test_a_two_device_host_fits_a_model_neither_device_holds_alone(files):
    directory, manifest, host = files
    split = profile(directory)
    alone = invoke("plan", manifest, split, "--host", host, "--engine", "llama-server")
    assert alone.exit_code == 1 and "PWR500" in alone.stderr
    out = directory / "plan.json"
    both = invoke("plan", manifest, split, "--host", host, "--device-index", 0, "--device-index", 1,
                  "--engine", "llama-server", "-o", out)
    assert both.exit_code == 0, both.stderr
    plan = load_plan(out)
    assert [d.index for d in plan.devices] == [0, 1] and plan.memory.engine == "llama-server"
    first, second = plan.memory.devices
    assert (first.verdict, second.verdict) == ("fits", "fits")
    assert first.holds == "layers 0-8" and second.holds == "layers 9-15 + output layer"
    for device in (first, second):  # each its layers' weights and KV, its compute buffer, a CUDA context
        assert {"target weights", "target KV (global)", "target compute buffer", "CUDA context"} <= \
               {c.name for c in device.components}
    assert {c.basis for c in first.components if c.name in ("CUDA context", "target compute buffer")} == {"estimated"}
    assert "device 1: GPU B" in both.stdout and "layers 9-15 + output layer" in both.stdout
    rendered = invoke("render", out, "--target", "llama-server")
    assert rendered.exit_code == 0, rendered.stderr
    words = shlex.split(rendered.stdout, comments=True)
    assert words[words.index("-sm") + 1] == "layer"
    assert words[words.index("-ts") + 1] == "704,704"  # each device's memory after the headroom, in MiB
    assert "export CUDA_VISIBLE_DEVICES=0,1" in rendered.stdout


def test_tensor_parallel_2_renders_for_vllm(files):
    directory, manifest, host = files
    out = directory / "tp.plan.json"
    result = invoke("plan", manifest, profile(directory, "tp", tensor_parallel=2, ctx=1024), "--host", host,
                    "--device-index", 1, "--device-index", 2, "--engine", "vllm", "-o", out)
    assert result.exit_code == 0, result.stderr
    plan = load_plan(out)
    assert plan.runtime.tensor_parallel == 2 and len(plan.memory.devices) == 2
    weights = [next(c for c in d.components if c.name == "target weights") for d in plan.memory.devices]
    assert weights[0].bytes == weights[1].bytes and weights[0].basis == "estimated"
    words = shlex.split(invoke("render", out, "--target", "vllm").stdout, comments=True)
    assert words[words.index("--tensor-parallel-size") + 1] == "2"
    assert "CUDA_VISIBLE_DEVICES=1,2" in invoke("render", out, "--target", "vllm").stdout


def test_the_split_is_written_as_the_profile_gives_it(files):
    directory, manifest, host = files
    out = directory / "skew.plan.json"
    result = invoke("plan", manifest, profile(directory, "skew", tensor_split=[9, 8]), "--host", host,
                    "--device-index", 0, "--device-index", 1, "--engine", "llama-server", "-o", out)
    assert result.exit_code == 0, result.stderr
    words = shlex.split(invoke("render", out, "--target", "llama-server").stdout, comments=True)
    assert words[words.index("-ts") + 1] == "9,8"
    main_only = directory / "main.plan.json"
    alone = invoke("plan", manifest, profile(directory, "main", split_mode="none", main_gpu=1, gpu_layers=8), "--host",
                   host, "--device-index", 0, "--device-index", 1, "--engine", "llama-server", "-o", main_only)
    assert alone.exit_code == 0, alone.stderr
    assert [d.holds for d in load_plan(main_only).memory.devices] == ["no layers", "layers 9-15 + output layer"]
    none_words = shlex.split(invoke("render", main_only, "--target", "llama-server").stdout, comments=True)
    assert none_words[none_words.index("-sm") + 1] == "none" and none_words[none_words.index("-mg") + 1] == "1"


BAD = [
    ({"slots": 0}, (0, 1), "llama-server", "PWR022", "runtime.slots"),
    ({"tensor_split": [1, 1, 1]}, (0, 1), "llama-server", "PWR507", "runtime.tensor_split"),
    ({"tensor_split": [1, -1]}, (0, 1), "llama-server", "PWR506", "runtime.tensor_split[1]"),
    ({"tensor_split": [0, 0]}, (0, 1), "llama-server", "PWR506", "runtime.tensor_split"),
    ({"tensor_parallel": 3}, (0, 1, 2), "vllm", "PWR509", "runtime.tensor_parallel"),
    ({"tensor_parallel": 2}, (0, 1, 2), "vllm", "PWR510", "runtime.tensor_parallel"),
    ({"main_gpu": 2}, (0, 1), "llama-server", "PWR508", "runtime.main_gpu"),
    ({}, (0, 1), "power", "PWR510", "runtime"),
    ({}, (0, 3), "llama-server", "PWR510", "runtime"),
    ({"kv_cache_type": "q8_0", "flash_attn": False}, (0,), "llama-server", "PWR511", "runtime.kv_cache_type"),
]


@pytest.mark.parametrize("runtime, devices, engine, code, where", BAD, ids=[b[3] + " " + b[4] for b in BAD])
def test_bad_split_settings_are_located_findings_and_no_plan(files, runtime, devices, engine, code, where):
    directory, manifest, host = files
    bad = profile(directory, "bad", **runtime)
    indices = [word for index in devices for word in ("--device-index", index)]
    result = invoke("plan", manifest, bad, "--host", host, *indices, "--engine", engine, "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["plan"] is None
    (finding,) = [f for f in data["findings"] if f["code"] == code]
    assert finding["where"] == where and finding["file"] == str(bad) and finding["line"] is not None


def test_a_micro_batch_above_the_batch_is_a_located_warning(tmp_path):
    loaded = load_profile(profile(tmp_path, "batches", batch=256, ubatch=512))
    (finding,) = [f for f in loaded.findings if f.code == "PWR505"]
    assert finding.where == "runtime.ubatch" and finding.line == 8 and codes(loaded.findings) == ["PWR505"]


FLEET = '''schema = "power.fleet/v1"
[[hosts]]
name = "pair"
headroom = "16 MiB"
devices = [{{ model = "GPU A", vram = "720 MiB" }}, {{ model = "GPU B", vram = "720 MiB" }}]

[[deployments]]
host = "pair"
{placement}
engine = "llama-server"
manifest = "{manifest}"
profile = "{profile}"
'''


def test_a_fleet_deployment_spans_devices_and_each_device_sums_its_part(files):
    directory, manifest, _ = files
    fleet = directory / "fleet.toml"
    fleet.write_text(FLEET.format(placement="devices = [0, 1]", manifest=manifest, profile=profile(directory)))
    result = invoke("fleet", "review", fleet, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    (host,) = data["hosts"]
    used = [device["planned_bytes"] for device in host["devices"]]
    assert all(0 < bytes_ < 720 * 1024**2 for bytes_ in used)
    assert host["deployments"][0]["device"] == [0, 1]
    fleet.write_text(FLEET.format(placement="device = 0\ndevices = [0, 1]", manifest=manifest,
                                  profile=profile(directory)))
    both = invoke("fleet", "review", fleet, "--json")
    assert both.exit_code == 1 and "not both" in both.stdout
