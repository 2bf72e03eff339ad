"""The memory model on real headers: the seeds' arithmetic, llama.cpp's per-layer accounting, the verdicts."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache

import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType as Q
from gguf_helpers import REPO, gemma
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_helpers import compiled, fixture, write_manifest, write_profile

from power.artifacts.factory import write_sparse_gguf
from power.artifacts.facts import inspect_artifact
from power.orchestrator.cli import main
from power.orchestrator.sizing import Budget, Request, drafter_kv_component, largest_context, size_plan

KiB, MiB, GiB = 1024, 1024**2, 1024**3
REPO_PROFILES = REPO / "profiles"


def components(sizing) -> dict[str, int]:
    return {c.name: c.bytes for c in sizing.components}


def test_dspark_drafter_kv_is_20_kib_per_position_and_5_gib_at_262144():
    dspark = inspect_artifact(fixture("qwen36-27b-dspark"))
    assert dspark.sliding_window is None
    kv = drafter_kv_component(dspark, 262_144, "f16")
    assert kv.bytes == 20 * KiB * 262_144 == 5 * GiB
    assert "20.00 KiB per position" in kv.detail and "no sliding window" in kv.detail


def test_a_2048_window_caps_the_same_drafter_kv_at_40_mib():
    dflash = inspect_artifact(fixture("qwen36-27b-dflash"))
    assert dflash.sliding_window == 2048
    assert drafter_kv_component(dflash, 262_144, "f16").bytes == 40 * MiB
    assert drafter_kv_component(dflash, 1024, "f16").bytes == 20 * KiB * 1024


def test_q6k_target_is_the_seeds_artifact_size():
    target = inspect_artifact(fixture("qwen36-27b-q6k"))
    assert target.size == 22_884_408_288


@pytest.fixture(scope="module")
def dspark_plan(tmp_path_factory):
    """The seeds' DSpark K10/S6 profile at ctx 512, batch 12, on a 24 GiB device (hashes the 22.9 GB sparse target once)."""
    directory = tmp_path_factory.mktemp("dspark")
    manifest = write_manifest(directory, "qwen36-27b-q6k", [{"kind": "mtp"}, {"kind": "dspark", "fixture": "qwen36-27b-dspark"}],
                              quant="Q6_K", architecture="qwen35")
    return compiled(manifest, REPO_PROFILES / "dspark-k10s6.toml", vram=24 * GiB)


@pytest.mark.slow
def test_dspark_k10s6_at_ctx_512_fits_24_gib_only_with_a_thin_margin(dspark_plan):
    plan, findings = dspark_plan
    assert plan is not None, [f.render() for f in findings]
    memory = plan.memory
    assert (plan.runtime.ctx, plan.runtime.batch, plan.speculation.rollback) == (512, 12, "guarded")
    assert memory.verdict == "fits" and 0 < memory.margin_bytes < 1 * GiB
    # The seeds measured a 23,847 MiB peak; the header-only target lacks 443 MiB of the real file's mixed quants.
    assert 23_000 * MiB < memory.total_bytes < 23_847 * MiB
    (thin,) = [f for f in plan.findings if f.code == "PWR503"]
    assert "requires a quiet device" in thin.message


@pytest.mark.slow
def test_every_component_of_the_dspark_plan_is_present(dspark_plan):
    plan, _ = dspark_plan
    names = [c.name for c in plan.memory.components]
    assert names == ["target weights", "target KV (global)", "recurrent state", "drafter weights", "drafter KV",
                     "target compute + logits", "drafter compute + logits", "CUDA context", "CUDA graphs"]
    kv = {c.name: c for c in plan.memory.components}["target KV (global)"]
    # 16 attention layers of 64 (full_attention_interval 4): the 48 recurrent ones hold state, not KV.
    assert kv.bytes == 16 * 4 * (256 + 256) * 512 * 2 and "16 layers" in kv.detail


def test_sliding_window_layers_sized_as_llama_cpp_sizes_them():
    facts = inspect_artifact(gemma())
    sizing = size_plan(facts, None, Request(ctx=32_768, verify_rows=8, snapshots=0, vocab=262_144), Budget(GiB, 0))
    parts = components(sizing)
    # 15 sliding layers cache pad(512 + n_ubatch 512, 256) = 1024 cells; the 3 global layers the whole context.
    assert parts["target KV (sliding)"] == 15 * 1 * (256 + 256) * 1024 * 2
    assert parts["target KV (global)"] == 3 * 1 * (256 + 256) * 32_768 * 2
    small = components(size_plan(facts, None, Request(ctx=512, verify_rows=8, snapshots=0, vocab=262_144), Budget(GiB, 0)))
    assert small["target KV (sliding)"] == 15 * 512 * 512 * 2


def test_per_layer_head_count_kv_arrays_are_honoured(tmp_path):
    layers = 4
    metadata = {"llama.block_count": layers, "llama.embedding_length": 256, "llama.feed_forward_length": 512,
                "llama.attention.head_count": 8, "llama.attention.head_count_kv": [8, 2, 8, 2],
                "llama.attention.key_length": 32, "llama.context_length": 4096}
    tensors = {f"blk.{i}.attn_q.weight": ((256, 256), Q.F16) for i in range(layers)}
    facts = inspect_artifact(write_sparse_gguf(tmp_path / "gqa.gguf", "llama", metadata, tensors))
    kv = components(size_plan(facts, None, Request(ctx=1024, verify_rows=4, snapshots=0, vocab=1000), Budget(GiB, 0)))
    assert kv["target KV (global)"] == (8 + 2 + 8 + 2) * (32 + 32) * 1024 * 2  # not 4 x element 0


def test_largest_context_is_the_boundary():
    facts = inspect_artifact(gemma())
    request = Request(ctx=4096, verify_rows=8, snapshots=0, vocab=262_144)
    budget = Budget(1536 * MiB, 128 * MiB)
    best = largest_context(facts, None, request, budget, 32_768)
    assert best is not None and best < 32_768
    assert size_plan(facts, None, replace(request, ctx=best), budget).margin_bytes >= 0
    assert size_plan(facts, None, replace(request, ctx=best + 1), budget).margin_bytes < 0


def test_partial_offload_places_fewer_bytes_on_the_device():
    facts = inspect_artifact(fixture("qwen36-27b-q6k"))
    full = components(size_plan(facts, None, Request(ctx=512, verify_rows=8, snapshots=0, vocab=248_320), Budget(GiB, 0)))
    half = components(size_plan(facts, None, Request(ctx=512, verify_rows=8, snapshots=0, vocab=248_320, gpu_layers=32),
                                Budget(GiB, 0)))
    assert half["target weights"] < full["target weights"] * 0.6
    assert half["target KV (global)"] == full["target KV (global)"] // 2


def test_a_device_smaller_than_the_weights_says_by_how_much(tmp_path):
    manifest = write_manifest(tmp_path, "hybrid-target", [{"kind": "mtp"}])
    plan, findings = compiled(manifest, write_profile(tmp_path, "mtp"), vram=64 * MiB, headroom=0)
    assert plan is None
    (finding,) = [f for f in findings if f.code == "PWR500"]
    assert "over by" in finding.message and "no context fits" in finding.hint
    assert finding.where == "runtime.ctx" and finding.line is not None


def test_fits_only_below_the_headroom_is_a_warning_and_still_plans(tmp_path):
    manifest = write_manifest(tmp_path, "hybrid-target", [{"kind": "mtp"}])
    profile = write_profile(tmp_path, "mtp")
    probe, _ = compiled(manifest, profile)
    total = probe.memory.total_bytes
    plan, findings = compiled(manifest, profile, vram=total + 10 * MiB, headroom=100 * MiB)
    assert plan is not None and plan.memory.verdict == "fits-below-headroom"
    assert "PWR501" in [f.code for f in plan.findings]


def test_size_command_table_json_and_exit_codes(tmp_path):
    manifest = write_manifest(tmp_path, "qwen36-27b-q6k", [{"kind": "dspark", "fixture": "qwen36-27b-dspark"}], hashed=False)
    profile = REPO_PROFILES / "dspark-k10s6.toml"
    runner = CliRunner()
    result = runner.invoke(main, ["size", str(manifest), str(profile), "--device", "24GiB", "--ctx", "262144", "--json"])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    drafter_kv = next(c for c in data["memory"]["components"] if c["name"] == "drafter KV")
    assert drafter_kv["bytes"] == 5 * GiB and data["memory"]["verdict"] == "does-not-fit"
    assert {"PWR500", "PWR502"} <= {f["code"] for f in data["findings"]}
    text = runner.invoke(main, ["size", str(manifest), str(profile), "--device", "24GiB"])
    assert text.exit_code == 0 and "largest context that fits" in text.stdout and "drafter KV" in text.stdout
    assert runner.invoke(main, ["size", str(manifest), str(profile)]).exit_code == 2



@settings(max_examples=60, deadline=None)
@given(a=st.integers(1, 262_144), b=st.integers(1, 262_144), s=st.integers(0, 16),
       cache=st.sampled_from(["f16", "q8_0", "q4_0", "f32"]), flash=st.booleans())
def test_every_total_grows_with_the_context(a, b, s, cache, flash):
    """The largest-context search assumes it: a longer context never needs less memory."""
    target, drafter = _qwen_headers()
    low, high = sorted((a, b))
    request = Request(ctx=low, verify_rows=11, snapshots=s, kv_cache_type=cache, flash_attn=flash, vocab=248_320)
    small = size_plan(target, drafter, request, Budget(GiB, 0)).total_bytes
    large = size_plan(target, drafter, replace(request, ctx=high), Budget(GiB, 0)).total_bytes
    assert small <= large


@cache
def _qwen_headers():
    return inspect_artifact(fixture("qwen36-27b-q6k")), inspect_artifact(fixture("qwen36-27b-dspark"))
