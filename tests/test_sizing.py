"""The memory model on real headers: llama-server's slot semantics, the layer split, the
reference arithmetic, verdicts."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache, partial

import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType as Q
from gguf_helpers import REPO, gemma
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_helpers import codes, compiled, fixture, write_manifest, write_profile

from power.app.cli import main
from power.artifacts.factory import write_sparse_gguf
from power.artifacts.facts import inspect_artifact
from power.documents.arithmetic import ARITHMETICS, FLOAT32, QUANTISED
from power.documents.kv_types import RUNTIME_KV_TYPES
from power.documents.plan import load_plan
from power.orchestrator.engines import adapter
from power.orchestrator.engines.llama_server.placement import place_layers
from power.orchestrator.engines.sizing import DeviceBudget, Request, Split, largest_context
from power.orchestrator.planning.compile import target_vocab
from power.runtime import kv_rows
from power.runtime.trunks import load_trunk
from power.runtime.trunks.base import GREEDY_HEAD

KiB, MiB, GiB = 1024, 1024**2, 1024**3
REPO_PROFILES = REPO / "profiles"
GEMMA_VOCAB = 262_144
CPU = (DeviceBudget(0, "cpu", 64 * GiB, 0, "cpu"),)
GPU = (DeviceBudget(0, "gpu", 24 * GiB, 0),)


def size_plan(engine: str, target, drafter, request: Request, devices):
    return adapter(engine).size(target, drafter, request, devices)


def parts(sizing, device: int = 0) -> dict[str, int]:
    return {c.name: c.bytes for c in sizing.devices[device].components}


def host_parts(sizing) -> dict[str, int]:
    return {c.name: c.bytes for c in sizing.host}


@cache
def gemma_facts():
    return inspect_artifact(gemma())


def gemma_on_cpu(**settings):
    return size_plan("llama-server", gemma_facts(), None, Request(vocab=GEMMA_VOCAB, **({"ctx": 4096} | settings)), CPU)


# --- llama-server's slot semantics -------------------------------------------------


def test_slots_split_the_context_unless_the_kv_is_unified():
    # 3 slots of pad(4096 / 3, 256) = 1536 cells: llama.cpp grows the context to 4608.
    split = gemma_on_cpu(slots=3)
    assert (split.slots.ctx_per_slot, split.slots.engine_ctx, split.slots.kv_streams) == (1536, 4608, 3)
    assert parts(split)["target KV (global)"] == 3 * 512 * 2 * 1536 * 3  # 3 global layers x (k+v) f16 x cells x streams
    unified = gemma_on_cpu(slots=3, kv_unified=True)
    assert (unified.slots.ctx_per_slot, unified.slots.engine_ctx, unified.slots.kv_streams) == (4096, 4096, 1)


def test_sliding_cells_follow_the_window_per_stream_or_shared():
    # per stream: pad(512 + 512, 256) = 1024 cells for each of 4 slots; unified: pad(512 x 4 + 512, 256) = 2560 shared
    assert gemma_on_cpu(slots=4).slots.sliding_cells == 1024
    assert parts(gemma_on_cpu(slots=4))["target KV (sliding)"] == 15 * 512 * 2 * 1024 * 4
    assert gemma_on_cpu(slots=4, kv_unified=True).slots.sliding_cells == 2560
    assert gemma_on_cpu(ctx=512).slots.sliding_cells == 512  # never more than the context


def test_batches_are_clamped_and_outputs_reserved_per_slot_and_draft():
    clamped = gemma_on_cpu(ctx=1000, batch=4096, ubatch=4096)
    assert (clamped.slots.batch, clamped.slots.ubatch) == (1000, 1000)  # n_batch = min(the given -c, -b)
    drafting = gemma_on_cpu(slots=4, chain=("ngram",), ngram_draft_max=3)
    assert drafting.slots.outputs == 16
    assert parts(drafting)["output buffer"] == 4 * GEMMA_VOCAB * 4  # one row per sequence at load
    assert parts(drafting)["output buffer growth"] == 12 * GEMMA_VOCAB * 4  # to 16 rows on a full verification
    assert gemma_on_cpu(slots=2, batch=5, chain=("ngram",), ngram_draft_max=48).slots.outputs == 5  # never more than -b


@pytest.mark.parametrize("flash, expected", [(True, 23_875_616), (False, 54_276_128)])
def test_compute_buffer_is_llamas_graph_reservation(flash, expected):
    """-c 4096 -np 1 -ub 512, to the byte (llama-server logs 22.7696 / 51.7617 MiB); the conformance test runs it."""
    component = next(
        c for c in gemma_on_cpu(flash_attn=flash).devices[0].components if c.name == "target compute buffer"
    )
    assert (component.bytes, component.basis) == (expected, "exact")
    assert ("kq" in component.detail) != flash


def test_recurrent_rows_per_sequence_and_rollback_rows():
    hybrid = inspect_artifact(fixture("hybrid-target"))
    one = size_plan("llama-server", hybrid, None, Request(ctx=1024, vocab=300), CPU)
    four = size_plan("llama-server", hybrid, None, Request(ctx=1024, vocab=300, slots=4, chain=("mtp",), draft_max=3),
                     CPU)
    assert parts(four)["recurrent state"] == parts(one)["recurrent state"] * 4 * (1 + 3)


# q8_0 only where the heads are whole 32-value blocks (the plan refuses the 16-wide fixtures': PWR513, below).
@pytest.mark.parametrize("name,kv_type", [(name, kv_type) for name in ("gemma", "gemma3-target", "dense-target",
                                                                       "hybrid-target")
                                          for kv_type in RUNTIME_KV_TYPES
                                          if kv_type != "q8_0" or name in ("gemma", "gemma3-target")])
def test_power_runtime_kv_is_the_runtimes_own_allocation(name, kv_type):
    """Power's runtime keeps every attention layer (sliding ones too) at pad(ctx + max(verify, prefill chunk), 256)
    positions, in the plan's KV type: the plan's figure is what the runtime's trunk allocates, in every type."""
    path = gemma() if name == "gemma" else fixture(name)
    facts = inspect_artifact(path)
    request = Request(ctx=1000, verify_rows=8, vocab=target_vocab(facts), kv_cache_type=kv_type)
    sizing = size_plan("power", facts, None, request, CPU)
    trunk = load_trunk(path, n_ctx=1000, verify_capacity=8, kv_type=kv_type)
    allocated = sum(cache.k.nbytes + cache.v.nbytes for layer in trunk.layers for cache in getattr(layer, "caches", ()))
    assert parts(sizing)["target KV"] == allocated
    assert sizing.engine == "power"


def test_power_runtime_kv_counts_every_layer_at_its_padded_capacity():
    dense = size_plan("power", inspect_artifact(fixture("dense-target")), None,
                      Request(ctx=1000, verify_rows=8, vocab=300, kv_cache_type="f32"), CPU)
    assert parts(dense)["target KV"] == 4 * 2 * 16 * 2 * 4 * 1280
    two = size_plan("power", gemma_facts(), None, Request(ctx=1000, verify_rows=8, slots=2, vocab=GEMMA_VOCAB), CPU)
    assert parts(two)["target KV"] == 18 * 1 * (256 + 256) * 2 * 768 * 2  # f16, sliding layers too, ctx / 2 a slot


@pytest.mark.parametrize("kv_type", RUNTIME_KV_TYPES)
def test_the_plans_kv_is_what_the_engine_holds_in_every_kv_type(tmp_path, kv_type):
    """The plan's target KV is the bytes the engine's caches hold in the profile's kv_cache_type (gemma3-target: heads
    32 wide, one q8_0 block a row), and the receipt says which type that is."""
    from power.runtime.engine import Engine, EngineOptions
    from power.runtime.workload import Workload

    manifest = write_manifest(tmp_path, "gemma3-target", [{"kind": "ngram"}])
    plan_path = tmp_path / "plan.json"
    result = CliRunner().invoke(main, ["plan", str(manifest), str(write_profile(tmp_path, "ngram", runtime={
        "ctx": 512, "slots": 2, "kv_cache_type": kv_type})), "--device", "8 GiB", "-o", str(plan_path)])
    assert result.exit_code == 0, result.output
    plan = load_plan(plan_path)
    engine = Engine(Workload.of_plan(plan, plan_path), EngineOptions())
    caches = [cache for layer in engine.trunk.layers for cache in (layer.caches.k, layer.caches.v)]
    assert {cache.dtype for cache in caches} == {kv_rows.DTYPES[kv_type]}
    held = sum(cache.nbytes for cache in caches)
    planned = {c.name: c for c in plan.memory.components}["target KV"]
    assert planned.bytes == held and planned.detail.endswith(f"x {kv_type}")
    assert held == {"f32": 4, "f16": 2, "bf16": 2, "q8_0": 34 / 32}[kv_type] * 6 * 2 * 32 * 512 * 2
    receipt = engine.generate("hello there", 4)
    assert receipt.runtime["kv_cache_type"] == kv_type


def test_a_kv_type_the_runtime_does_not_hold_is_refused_at_the_profiles_key(tmp_path):
    """q4_0 is not a type Power's runtime holds (PWR512); q8_0 needs head rows of whole 32-value blocks (PWR513: the
    dense fixture's heads are 16 wide). Neither plans, and nothing is downgraded."""
    manifest = write_manifest(tmp_path, "dense-target", [{"kind": "ngram"}])
    for kv_type, code in (("q4_0", "PWR512"), ("q8_0", "PWR513")):
        profile = write_profile(tmp_path, "ngram", runtime={"kv_cache_type": kv_type})
        result = CliRunner().invoke(main, ["plan", str(manifest), str(profile), "--device", "8 GiB", "-o",
                                           str(tmp_path / "plan.json")])
        assert result.exit_code != 0 and code in result.output and "kv_cache_type = " in result.output, result.output
        assert not (tmp_path / "plan.json").exists()


def test_the_plans_slots_are_what_the_engine_allocates(tmp_path):
    """Defect 3: with ctx 1024 and 4 slots the plan charged 1024 positions a slot (5,242,880 B of target KV) while
    `Engine` gives each slot ctx / slots = 256 (2,097,152 B in f32). The plan and the engine now read one geometry
    (and, since, one KV type: the profile's f16, 1,048,576 B)."""
    from power.runtime.engine import Engine, EngineOptions
    from power.runtime.workload import Workload

    manifest = write_manifest(tmp_path, "dense-target", [{"kind": "ngram"}])
    plan_path = tmp_path / "plan.json"
    result = CliRunner().invoke(main, ["plan", str(manifest), str(write_profile(tmp_path, "ngram", runtime={
        "ctx": 1024, "slots": 4})), "--device", "8 GiB", "-o", str(plan_path)])
    assert result.exit_code == 0, result.output
    plan = load_plan(plan_path)
    engine = Engine(Workload.of_plan(plan, plan_path), EngineOptions())
    allocated = sum(cache.k.nbytes + cache.v.nbytes for layer in engine.trunk.layers for cache in layer.caches)
    assert plan.memory.slots.ctx_per_slot == engine.n_ctx == 256
    assert {c.name: c.bytes for c in plan.memory.components}["target KV"] == allocated == 1_048_576  # in f16


@pytest.mark.parametrize("arithmetic", ARITHMETICS)
@pytest.mark.parametrize("name", ["gemma", "dense-target", "hybrid-target"])
def test_power_runtime_weights_are_what_the_loader_holds(name, arithmetic):
    """The target's weights in a Power plan equal the bytes the runtime's loader holds (every matrix, vector, the
    embedding's GGUF rows and the exact greedy head's compact copy of the LM head), measured on the loaded trunk, in
    both arithmetics."""
    path = gemma() if name == "gemma" else fixture(name)
    facts = inspect_artifact(path)
    request = Request(ctx=256, verify_rows=4, vocab=target_vocab(facts), arithmetic=arithmetic)
    planned = parts(size_plan("power", facts, None, request, CPU))
    trunk = load_trunk(path, n_ctx=256, verify_capacity=4, arithmetic=arithmetic)
    assert planned["target weights"] + planned.get("greedy LM head", 0) == trunk.weight_bytes
    # the exact greedy head's compact copy: charged where the runtime takes it (Gemma's Q8_0 head, quantised), exactly
    assert ("greedy LM head" in planned) == (name == "gemma" and arithmetic == QUANTISED) == (GREEDY_HEAD in trunk.held)


def test_power_runtime_mtp_head_weights_are_what_the_head_holds():
    """The MTP head's matrices stay in their GGUF blocks (the CPU kernels' tiles), its vectors f32: the plan charges
    exactly what the loaded head holds (it once charged every element as f32)."""
    from spec_helpers import built, trunk

    facts = inspect_artifact(fixture("hybrid-target"))
    request = Request(ctx=256, verify_rows=4, vocab=target_vocab(facts), use_mtp=True)
    planned = parts(size_plan("power", facts, None, request, CPU))["MTP head weights"]
    assert planned == built("mtp", "hybrid", trunk("hybrid")).weight_bytes


@pytest.mark.parametrize("kind", ["dflash", "dflash2", "dspark"])
def test_power_runtime_block_drafter_weights_are_what_the_drafter_holds(kind):
    """A block drafter's matrices stay in their GGUF blocks (the CPU kernels' tiles), a DSpark Markov table in its GGUF
    rows, the rest f32: the plan charges what the loaded drafter holds (it once dequantised every tensor to f32)."""
    from spec_helpers import DRAFTERS, built, fixture_dir, trunk

    from power.runtime.speculators.dflash import held_bytes

    target = inspect_artifact(fixture("dense-target"))
    drafter = inspect_artifact(fixture_dir() / DRAFTERS[kind])
    request = Request(ctx=256, verify_rows=11, vocab=target_vocab(target))
    planned = parts(size_plan("power", target, drafter, request, CPU))["drafter weights"]
    loaded = built(kind, "dense", trunk("dense"))
    assert planned == held_bytes(loaded.w) < sum(t.nbytes for t in drafter.tensors) * 4


def test_power_runtime_recurrent_state_is_at_most_what_the_plan_charges():
    """A hybrid slot holds its live state, the state its last forward started from and the one at its last whole
    prefill chunk, sharing tensors where they are the same, plus its last forward's replay inputs: after a prefill
    that ends a chunk and a speculative-sized forward they are all distinct, and the plan charges that much."""
    facts = inspect_artifact(fixture("hybrid-target"))
    request = Request(ctx=256, verify_rows=4, vocab=target_vocab(facts), snapshots=3)
    planned = parts(size_plan("power", facts, None, request, CPU))["recurrent state"]
    trunk = load_trunk(fixture("hybrid-target"), n_ctx=256, verify_capacity=4, snapshot_rows=3)
    trunk.prefill([3 + i % 50 for i in range(64)])  # two whole chunks of 32 rows: the chunk's state at 64
    trunk.forward([6])
    trunk.forward([7, 8, 9, 10])  # started at 65, live at 69
    window = trunk.windows[0]
    states = [t for held in (trunk.states[0], window.base, trunk.chunk_states[0][1]) for s in held.values()
              for t in (s.conv, s.delta)]
    inputs = [t for i in window.inputs.values() for t in (i.qkv, i.decay, i.beta)]

    def distinct(tensors):
        return sum({t.data_ptr(): t.nbytes for t in tensors}.values())

    assert distinct(states) == sum(t.nbytes for t in states)  # three distinct states
    per_row = distinct(inputs) // 4
    assert planned == distinct(states) + per_row * 32  # at most a prefill chunk's 32 rows of inputs


def test_on_a_gpu_the_drafters_are_host_memory():
    """The learned drafters run on the CPU: on a GPU plan their weights, caches and compute are host memory, outside
    the device's verdict; on a CPU plan they count on the device (the host)."""
    target, dspark = _qwen_headers()
    request = Request(ctx=4096, verify_rows=11, vocab=248_320, use_mtp=True, snapshots=7)
    gpu = size_plan("power", target, dspark, request, GPU)
    assert {"MTP head weights", "MTP head KV", "drafter weights", "drafter KV"} <= set(host_parts(gpu))
    assert not {"MTP head weights", "drafter weights"} & set(parts(gpu))
    cpu = size_plan("power", target, dspark, request, (DeviceBudget(0, "cpu", 64 * GiB, 0, "cpu"),))
    assert {"MTP head weights", "drafter weights"} <= set(parts(cpu)) and not cpu.host


def test_the_27b_q6k_target_plans_for_power_on_a_48_gib_device():
    """Quantised, the Qwen3.6-27B Q6_K target's weights are about a byte a weight (not the 4 of float32, 104 GiB):
    the target-only plan fits a 48 GiB device with its KV."""
    facts = inspect_artifact(fixture("qwen36-27b-q6k"))
    device = (DeviceBudget(0, "gpu", 48 * GiB, 0),)
    cpu = (DeviceBudget(0, "cpu", 48 * GiB, 0, "cpu"),)
    request = Request(ctx=4096, verify_rows=11, vocab=target_vocab(facts))
    for devices in (device, cpu):
        sizing = size_plan("power", facts, None, request, devices)
        weights = parts(sizing)["target weights"]
        assert weights < 1.3 * facts.size and sizing.verdict == "fits", (weights / GiB, sizing.total_bytes / GiB)
    reference = size_plan("power", facts, None, replace(request, arithmetic=FLOAT32), device)
    assert reference.verdict == "does-not-fit"


# --- placement on several devices ----------------------------------------------------


def test_layer_split_follows_llamas_float32_rule():
    two = (DeviceBudget(0, "a", 24 * GiB, 0), DeviceBudget(1, "b", 24 * GiB, 0))
    placed = place_layers(18, None, two, Split(ratios=(3.0, 1.0)))
    assert placed.layers_on(0) == list(range(15)) and placed.layers_on(1) == [15, 16, 17] and placed.output == 1
    counts = place_layers(18, None, two, Split(ratios=(10.0, 9.0)))
    assert len(counts.layers_on(0)) == 10  # ratios as layer counts (the output layer counted last) are exact
    partial = place_layers(18, 5, two, Split(ratios=(1.0, 1.0)))  # -ngl 5: the output layer and 4 blocks
    assert partial.layers.count(None) == 14 and partial.output == 1
    alone = place_layers(18, None, two, Split(mode="none", main=1))
    assert set(alone.layers) == {1} and alone.output == 1


def test_each_device_holds_its_layers_weights_and_kv_and_the_host_the_input_layer():
    two = (DeviceBudget(0, "a", 24 * GiB, 0), DeviceBudget(1, "b", 24 * GiB, 0))
    sizing = size_plan("llama-server", gemma_facts(), None,
                       Request(ctx=4096, vocab=GEMMA_VOCAB, split=Split(ratios=(15.0, 4.0))), two)
    first, second = parts(sizing, 0), parts(sizing, 1)
    assert first["target KV (global)"] == 2 * 512 * 2 * 4096  # layers 5, 11 on device 0; 17 on device 1
    assert second["target KV (global)"] == 1 * 512 * 2 * 4096
    embedding = next(t.nbytes for t in gemma_facts().tensors if t.name == "token_embd.weight")
    assert host_parts(sizing)["target weights"] == embedding  # the input layer stays in host memory
    assert "duplicate of token_embd" in next(c.detail for c in sizing.devices[1].components
                                             if c.name == "target weights")  # tied output on the output device
    assert {c.name for d in sizing.devices for c in d.components if c.basis == "estimated"} >= {"CUDA context"}
    assert "output buffer" in host_parts(sizing)  # the output buffer is the output device's host buffer


def test_a_model_neither_device_holds_alone_fits_split_across_both(tmp_path):
    """Qwen3.6-27B Q6_K (21.3 GiB of weights) on two 16 GiB devices, as llama-server layer-splits it."""
    manifest = write_manifest(tmp_path, "qwen36-27b-q6k", hashed=False)
    profile = write_profile(tmp_path, "none", runtime={"ctx": 8192, "flash_attn": True})
    runner = CliRunner()
    alone = runner.invoke(main, ["size", str(manifest), str(profile), "--device", "16GiB", "--engine", "llama-server"])
    assert alone.exit_code == 1 and "PWR500" in alone.stderr
    both = runner.invoke(main, ["size", str(manifest), str(profile), "--device", "16GiB", "--device", "16GiB",
                                "--engine", "llama-server", "--json"])
    assert both.exit_code == 0, both.stderr
    memory = json.loads(both.stdout)["memory"]
    assert [d["verdict"] for d in memory["devices"]] == ["fits", "fits"]
    holds = [d["holds"] for d in memory["devices"]]
    assert holds[0].startswith("layers 0-") and holds[1].endswith("+ output layer")


# --- the reference arithmetic ---------------------------------------------------------


def test_dspark_drafter_kv_is_20_kib_per_position_and_5_gib_at_262144():
    target, dspark = _qwen_headers()
    sizing = size_plan("llama-server", target, dspark, Request(ctx=262_144, vocab=248_320), GPU)
    assert parts(sizing)["drafter KV (global)"] == 20 * KiB * 262_144 == 5 * GiB


def test_a_2048_window_caps_the_drafter_kv():
    target, _ = _qwen_headers()
    dflash = inspect_artifact(fixture("qwen36-27b-dflash"))
    assert dflash.sliding_window == 2048
    llama = size_plan("llama-server", target, dflash, Request(ctx=262_144, vocab=248_320), GPU)
    # llama.cpp's sliding cache: pad(2048 + n_ubatch 512, 256) = 2560 cells of 20 KiB
    assert parts(llama)["drafter KV (sliding)"] == 20 * KiB * 2560
    power = size_plan("power", target, dflash, Request(ctx=262_144, vocab=248_320), GPU)
    assert host_parts(power)["drafter KV"] == 40 * KiB * 2048  # Power's ring: the window itself, in f32, on the host


def test_q6k_target_is_the_reference_artifact_size():
    target = inspect_artifact(fixture("qwen36-27b-q6k"))
    assert target.size == 22_884_408_288


@pytest.fixture(scope="module")
def dspark_plan(tmp_path_factory):
    """The reference DSpark K10/S6 profile at ctx 512, batch 12, for llama-server on a 24 GiB device."""
    from plan_helpers import host

    from power.orchestrator.inputs.loading import load_manifest, load_profile
    from power.orchestrator.planning.compile import compile_plan

    directory = tmp_path_factory.mktemp("dspark")
    manifest = write_manifest(
        directory,
        "qwen36-27b-q6k",
        [{"kind": "mtp"}, {"kind": "dspark", "fixture": "qwen36-27b-dspark"}],
        quant="Q6_K",
        architecture="qwen35",
    )
    return compile_plan(load_manifest(manifest), load_profile(REPO_PROFILES / "dspark-k10s6.toml"), host(24 * GiB),
                        engine="llama-server")


@pytest.mark.slow
def test_dspark_k10s6_at_ctx_512_fits_24_gib_only_with_a_thin_margin(dspark_plan):
    plan, findings = dspark_plan
    assert plan is not None, [f.render() for f in findings]
    memory = plan.memory
    assert (plan.runtime.ctx, plan.runtime.batch, plan.speculation.rollback, memory.engine) == (512, 12, "guarded",
                                                                                              "llama-server")
    assert memory.verdict == "fits" and 0 < memory.margin_bytes < 1 * GiB
    # The reference measurements (docs/reference.md) found a 23,847 MiB peak; the header-only target lacks 443 MiB of
    # the real file's mixed quants.
    assert 23_000 * MiB < memory.total_bytes < 23_847 * MiB
    (thin,) = [f for f in plan.findings if f.code == "PWR503"]
    assert "requires a quiet device" in thin.message


@pytest.mark.slow
def test_every_component_of_the_dspark_plan_is_present(dspark_plan):
    plan, _ = dspark_plan
    (device,) = plan.memory.devices
    names = [c.name for c in device.components]
    # the bundled profile asks for CUDA graphs, as the reference ran (docs/sizing.md): their pool is charged
    assert names == ["target weights", "target KV (global)", "recurrent state", "target compute buffer",
                     "drafter weights", "drafter KV (global)", "drafter compute buffer", "CUDA context", "CUDA graphs"]
    kv = {c.name: c for c in device.components}["target KV (global)"]
    # 16 attention layers of 64 (full_attention_interval 4): the 48 recurrent ones hold state, not KV.
    assert kv.bytes == 16 * 4 * (256 + 256) * 512 * 2 and "16 layers" in kv.detail
    recurrent = {c.name: c for c in device.components}["recurrent state"]
    assert "1 + 10 rollback rows" in recurrent.detail  # draft-dspark keeps --spec-draft-n-max rows per sequence
    assert {c.name for c in plan.memory.host} >= {"target weights", "output buffer", "output buffer growth"}


def test_per_layer_head_count_kv_arrays_are_honoured(tmp_path):
    layers = 4
    metadata = {"llama.block_count": layers, "llama.embedding_length": 256, "llama.feed_forward_length": 512,
                "llama.attention.head_count": 8, "llama.attention.head_count_kv": [8, 2, 8, 2],
                "llama.attention.key_length": 32, "llama.context_length": 4096}
    tensors = {f"blk.{i}.attn_q.weight": ((256, 256), Q.F16) for i in range(layers)}
    facts = inspect_artifact(write_sparse_gguf(tmp_path / "gqa.gguf", "llama", metadata, tensors))
    flash = parts(size_plan("llama-server", facts, None, Request(ctx=1024, vocab=1000, flash_attn=True), CPU))
    assert flash["target KV (global)"] == (8 + 2 + 8 + 2) * (32 + 32) * 1024 * 2  # not 4 x element 0
    # without flash attention V is stored transposed, every layer padded to the widest (n_embd_v_gqa_max)
    plain = parts(size_plan("llama-server", facts, None, Request(ctx=1024, vocab=1000), CPU))
    assert plain["target KV (global)"] == ((8 + 2 + 8 + 2) * 32 + 4 * 8 * 32) * 1024 * 2


def test_largest_context_is_the_boundary():
    facts = gemma_facts()
    request = Request(ctx=4096, vocab=GEMMA_VOCAB, verify_rows=8)
    for engine, memory in (("llama-server", 1024 * MiB), ("power", 1024 * MiB)):
        device = (DeviceBudget(0, "small", memory, 128 * MiB),)
        best = largest_context(partial(size_plan, engine, facts, None, devices=device), request, 32_768)
        assert best is not None and best < 32_768
        assert size_plan(engine, facts, None, replace(request, ctx=best), device).margin_bytes >= 0
        assert size_plan(engine, facts, None, replace(request, ctx=best + 1), device).margin_bytes < 0


def test_partial_offload_keeps_the_first_layers_on_the_host():
    facts = inspect_artifact(fixture("qwen36-27b-q6k"))
    full = size_plan("llama-server", facts, None, Request(ctx=512, vocab=248_320), GPU)
    part = size_plan("llama-server", facts, None, Request(ctx=512, vocab=248_320, gpu_layers=32), GPU)
    # -ngl 32 of 65 blocks + output: i_gpu_start = 66 - 32 = 34, blocks 34-64 and the output layer on the device
    assert part.devices[0].holds == "layers 34-64 + output layer"
    assert parts(part)["target weights"] < parts(full)["target weights"] * 0.6
    assert parts(part)["target KV (global)"] == 32 * MiB // 2  # attention layers 35, 39, ..., 59, 63 of 3, 7, ..., 63
    assert host_parts(part)["target KV (global)"] == 32 * MiB // 2


# --- verdicts and their findings ------------------------------------------------------


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
    assert "PWR501" in codes(plan.findings)


def test_the_hint_proposes_a_split_before_a_smaller_context(tmp_path):
    """An even split overflows the smaller device; a split skewed to the larger one fits at the same ctx."""
    manifest = write_manifest(tmp_path, "qwen36-27b-q6k", hashed=False)
    profile = write_profile(tmp_path, "none", runtime={"ctx": 8192, "flash_attn": True, "tensor_split": [1, 1]})
    devices = ["--device", "8GiB", "--device", "16GiB", "--engine", "llama-server"]
    result = CliRunner().invoke(main, ["size", str(manifest), str(profile), *devices, "--json"])
    findings = json.loads(result.stdout)["findings"]
    over = [f for f in findings if f["code"] == "PWR500"]
    assert over and over[0]["where"] == "runtime.tensor_split"
    assert "set runtime.tensor_split = [" in over[0]["hint"] and "to fit at ctx 8,192" in over[0]["hint"]
    counts = json.loads(over[0]["hint"].split("= ", 1)[1].split("]")[0] + "]")
    skewed = write_profile(tmp_path, "none", name="skewed",
                           runtime={"ctx": 8192, "flash_attn": True, "tensor_split": counts})
    fits = CliRunner().invoke(main, ["size", str(manifest), str(skewed), *devices])
    assert fits.exit_code == 0, fits.stderr


def test_size_command_table_json_and_exit_codes(tmp_path):
    manifest = write_manifest(tmp_path, "qwen36-27b-q6k", [{"kind": "dspark", "fixture": "qwen36-27b-dspark"}],
                              hashed=False)
    profile = REPO_PROFILES / "dspark-k10s6.toml"
    runner = CliRunner()
    result = runner.invoke(main, ["size", str(manifest), str(profile), "--device", "24GiB", "--ctx", "262144",
                                  "--engine", "llama-server", "--json"])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    drafter_kv = next(c for c in data["memory"]["devices"][0]["components"] if c["name"] == "drafter KV (global)")
    assert drafter_kv["bytes"] == 5 * GiB and data["memory"]["verdict"] == "does-not-fit"
    assert data["engine"] == "llama-server" and drafter_kv["basis"] == "estimated"
    assert {"PWR500", "PWR502"} <= {f["code"] for f in data["findings"]}
    text = runner.invoke(main, ["size", str(manifest), str(profile), "--device", "24GiB", "--engine", "llama-server"])
    assert text.exit_code == 0 and "largest context that fits" in text.stdout and "drafter KV" in text.stdout
    assert "estimated, not exact to the engine: CUDA context" in text.stdout
    assert runner.invoke(main, ["size", str(manifest), str(profile)]).exit_code == 2


@settings(max_examples=40, deadline=None)
@given(a=st.integers(1, 262_144), b=st.integers(1, 262_144), s=st.integers(0, 16), slots=st.integers(1, 8),
       unified=st.booleans(), cache=st.sampled_from(["f16", "q8_0", "q4_0", "f32"]), flash=st.booleans(),
       engine=st.sampled_from(["llama-server", "power", "vllm"]))
def test_every_total_grows_with_the_context(a, b, s, slots, unified, cache, flash, engine):
    """The largest-context search assumes it: a longer context never needs less memory."""
    target, drafter = _qwen_headers()
    low, high = sorted((a, b))
    request = Request(ctx=low, verify_rows=11, snapshots=s, chain=("mtp",), draft_max=s, slots=slots,
                      kv_unified=unified, kv_cache_type=cache, flash_attn=flash, vocab=248_320)
    drafter = None if engine == "vllm" else drafter
    small = size_plan(engine, target, drafter, request, GPU)
    large = size_plan(engine, target, drafter, replace(request, ctx=high), GPU)
    assert small.total_bytes <= large.total_bytes


@cache
def _qwen_headers():
    return inspect_artifact(fixture("qwen36-27b-q6k")), inspect_artifact(fixture("qwen36-27b-dspark"))


# The bundled Qwen3.6-27B profiles (docs/sizing.md, "The production profiles on Power's runtime").
QWEN_PROFILES = ["balanced-k7s7", "guarded-k7s6", "q6k-peak-fr8192", "dspark-k10s6", "dflash2", "target-only"]


@pytest.mark.parametrize("profile", QWEN_PROFILES)
def test_every_bundled_qwen_profile_fits_a_24_gib_device_on_powers_runtime(tmp_path, profile):
    """Each bundled Qwen3.6-27B profile, with its own KV type (f16), fits a 24 GiB GPU on Power's runtime: the target's
    weights in their GGUF rows, the KV in f16, three recurrent states plus replay inputs; the learned drafters (MTP
    head, DSpark, DFlash2, in their GGUF blocks) are host memory beside it."""
    manifest = write_manifest(
        tmp_path,
        "qwen36-27b-q6k",
        [
            {"kind": "mtp"},
            {"kind": "dspark", "fixture": "qwen36-27b-dspark"},
            {"kind": "dflash2", "fixture": "qwen36-27b-dflash2"},
        ],
        hashed=False,
        quant="Q6_K",
        architecture="qwen35",
    )
    result = CliRunner().invoke(main, ["size", str(manifest), str(REPO_PROFILES / f"{profile}.toml"), "--device",
                                       "24GiB",
                                       "--engine", "power", "--json"])
    assert result.exit_code == 0, result.output
    memory = json.loads(result.stdout)["memory"]
    assert memory["verdict"] == "fits" and memory["margin_bytes"] > 512 * MiB, memory["margin_bytes"] / MiB
    device = {c["name"]: c for c in memory["devices"][0]["components"]}
    assert device["target KV"]["detail"].endswith("x f16")
    assert device["recurrent state"]["bytes"] < 600 * MiB  # 1.17 GiB of f32 snapshots at S = 7 before
    host = {c["name"]: c["bytes"] for c in memory["host"]}
    if profile == "dflash2" or profile.startswith("dspark"):
        assert host["drafter weights"] < 2 * GiB  # 6.6 GiB dequantised to f32 before


def test_cuda_graphs_stay_as_the_profile_says_and_only_powers_runtime_is_warned(tmp_path):
    """Issue 40 (noticed), revisited: the bundled Qwen3.6-27B profiles ask for CUDA graphs, as their reference figures
    ran on llama-server, which captures the qwen35 hybrid: llama-server takes them without a word (its render sets no
    GGML_CUDA_DISABLE_GRAPHS, tests/test_render.py). Only Power's runtime, which refuses to capture the recurrent trunk
    on a CUDA device at load (PWR607), is warned at plan, at the profile's key, with the fix (PWR651); on a CPU host
    graphs do not apply and nothing is said."""
    manifest = write_manifest(tmp_path, "qwen36-27b-q6k", [
        {"kind": "mtp"}, {"kind": "dspark", "fixture": "qwen36-27b-dspark"},
        {"kind": "dflash2", "fixture": "qwen36-27b-dflash2"}], name="all", hashed=False, quant="Q6_K",
        architecture="qwen35")
    llama_server_runs = write_manifest(tmp_path, "qwen36-27b-q6k", [
        {"kind": "mtp"}, {"kind": "dspark", "fixture": "qwen36-27b-dspark"}], name="mtp-dspark", hashed=False,
        quant="Q6_K", architecture="qwen35")  # llama-server has no DFlash2 type
    cpu = tmp_path / "cpu.toml"
    cpu.write_text(
        'schema = "power.host/v1"\nname = "cpu"\ndevices = [{ model = "cpu", vram = "64 GiB", kind = "cpu" }]\n'
    )
    runner = CliRunner()
    for bundled in QWEN_PROFILES:
        profile = REPO_PROFILES / f"{bundled}.toml"
        line = next(number for number, text in enumerate(profile.read_text().splitlines(), 1)
                    if text.startswith("cuda_graphs = true"))
        warned = runner.invoke(main, ["size", str(manifest), str(profile), "--device", "24GiB", "--engine", "power"])
        assert warned.exit_code == 0, warned.output
        assert f"{profile}:{line}:15: PWR651 [warning] engine power: runtime.cuda_graphs = true, but Power's runtime " \
               "cannot capture the qwen35 target in CUDA graphs" in warned.stderr, warned.stderr
        assert "set cuda_graphs = false in the profile's [runtime] to run it on Power's runtime" in warned.stderr
        on_cpu = runner.invoke(main, ["size", str(manifest), str(profile), "--host", str(cpu), "--engine", "power"])
        assert on_cpu.exit_code == 0 and "PWR651" not in on_cpu.output, on_cpu.output
        if bundled != "dflash2":
            on_llama_server = runner.invoke(main, ["size", str(llama_server_runs), str(profile), "--device", "24GiB",
                                                   "--engine", "llama-server"])
            assert on_llama_server.exit_code == 0 and "PWR651" not in on_llama_server.output, on_llama_server.output


def test_the_dspark_reference_row_of_docs_sizing_is_what_the_profile_sizes_to(tmp_path):
    """Issue 40 (docs drift): docs/sizing.md's DSpark row showed an older 23,572 MiB. The row is the bundled
    dspark-k10s6 profile sized for llama-server on a 24 GiB device, as `power size` prints it now."""
    manifest = write_manifest(
        tmp_path,
        "qwen36-27b-q6k",
        [{"kind": "mtp"}, {"kind": "dspark", "fixture": "qwen36-27b-dspark"}],
        hashed=False,
        quant="Q6_K",
        architecture="qwen35",
    )
    sized = CliRunner().invoke(main, ["size", str(manifest), str(REPO_PROFILES / "dspark-k10s6.toml"), "--device",
                                      "24GiB", "--engine", "llama-server", "--json"])
    memory = json.loads(sized.stdout)["memory"]
    total, margin = memory["devices"][0]["total_bytes"], memory["margin_bytes"]
    row = next(line for line in (REPO / "docs" / "sizing.md").read_text().splitlines()
               if line.startswith("| DSpark K10/S6, ctx 512, batch 12, 24 GiB |"))
    assert f"| {total / GiB:.2f} GiB ({total / MiB:,.0f} MiB), margin {margin / MiB:.0f} MiB: fits, `PWR503`" in row, (
        row
    )


def test_the_two_device_example_of_docs_sizing_runs_as_written(tmp_path):
    """Issue 40 (docs drift): docs/sizing.md's two-device example gave no manifest or profile. It gives both now;
    this runs its command on them and finds every line it shows (a `...` line stands for lines left out)."""
    text = (REPO / "docs" / "sizing.md").read_text()
    example = text[text.index("A two-device host that fits"):text.index("One 16 GiB device alone needs")]
    blocks = example.split("```")[1::2]
    files = {}
    for block in blocks[:2]:
        header, _, body = block.removeprefix("toml\n").partition("\n")
        files[header.removeprefix("# fixtures/")] = body
    shown = [line for line in blocks[2].strip("\n").splitlines() if line.strip() != "..."]
    (tmp_path / "qwen36-27b-q6k.gguf").symlink_to(fixture("qwen36-27b-q6k"))
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    command = example.split("`power size ")[1].split("`")[0].split()
    assert command[:2] == ["fixtures/qwen36.manifest.toml", "fixtures/split.toml"]
    sized = CliRunner().invoke(main, ["size", str(tmp_path / "qwen36.manifest.toml"), str(tmp_path / "split.toml"),
                                      *command[2:]])
    assert sized.exit_code == 0, sized.output
    missing = [line for line in shown if not any(_shows(line, printed) for printed in sized.stdout.splitlines())]
    assert not missing, missing


def _shows(documented: str, printed: str) -> bool:
    """`printed` is the documented line, a `...` inside it standing for any text."""
    head, *_, tail = documented.split("...") if "..." in documented else (documented, "")
    return printed == documented or ("..." in documented and printed.startswith(head) and printed.endswith(tail)
                                     and len(printed) >= len(head) + len(tail))
