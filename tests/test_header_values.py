"""Header values the runtime trusts: a header no model could have is refused by `power plan` and `power run` alike.

Each hostile file is written with gguf's writer in one of three runnable layouts (the
factory's dense qwen3 and hybrid qwen35 trunks, and a small gemma3), with one header
value or tensor shape changed; the unchanged layouts plan and run.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from gguf_helpers import fixtures

from power import modes
from power.app.cli import main
from power.artifacts import contracts, factory
from power.artifacts.digests import sha256_file
from power.artifacts.factory import DENSE, HYBRID, TOKENIZER, Tensor, write_gguf
from power.artifacts.runtime_types import RUNTIME_TYPES
from power.documents.plan import ResolvedPlan, load_plan, save_plan
from power.kernels.dequant import BLOCK_LAYOUT
from power.runtime.linear import CPU_TYPES

GEMMA = dict(d_model=64, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=32, ffn=128, window=16)


def dense_layout() -> tuple[str, dict, dict]:
    metadata = factory.dense_metadata(DENSE, "qwen3", "hostile", gguf.LlamaFileType.ALL_F32)
    return "qwen3", metadata, factory.dense_tensor_shapes(DENSE)


def hybrid_layout() -> tuple[str, dict, dict]:
    return "qwen35", factory.hybrid_metadata(HYBRID, "hostile", gguf.LlamaFileType.ALL_F32), \
        factory.hybrid_tensor_shapes(HYBRID)


def gemma_layout() -> tuple[str, dict, dict]:
    g, d = GEMMA, GEMMA["d_model"]
    q, kv = g["n_heads"] * g["head_dim"], g["n_kv_heads"] * g["head_dim"]
    metadata = {f"gemma3.{key}": value for key, value in (
        ("context_length", 512), ("embedding_length", d), ("block_count", g["n_layers"]),
        ("feed_forward_length", g["ffn"]), ("attention.head_count", g["n_heads"]),
        ("attention.head_count_kv", g["n_kv_heads"]), ("attention.key_length", g["head_dim"]),
        ("attention.value_length", g["head_dim"]), ("attention.layer_norm_rms_epsilon", 1e-6),
        ("attention.sliding_window", g["window"]), ("rope.freq_base", 1_000_000.0))}
    shapes = {"token_embd.weight": (TOKENIZER.vocab_size, d), "output_norm.weight": (d,)}
    for i in range(g["n_layers"]):
        shapes |= {f"blk.{i}.{name}": shape for name, shape in (
            ("attn_norm.weight", (d,)), ("attn_q.weight", (q, d)), ("attn_k.weight", (kv, d)),
            ("attn_v.weight", (kv, d)), ("attn_q_norm.weight", (g["head_dim"],)),
            ("attn_k_norm.weight", (g["head_dim"],)), ("attn_output.weight", (d, q)),
            ("post_attention_norm.weight", (d,)), ("ffn_norm.weight", (d,)), ("ffn_gate.weight", (g["ffn"], d)),
            ("ffn_up.weight", (g["ffn"], d)), ("ffn_down.weight", (d, g["ffn"])), ("post_ffw_norm.weight", (d,)))}
    return "gemma3", metadata, shapes


LAYOUTS = {"dense": dense_layout, "hybrid": hybrid_layout, "gemma3": gemma_layout}


def write_variant(path: Path, layout: str, metadata: dict | None = None, shapes: dict | None = None,
                  types: dict | None = None) -> Path:
    """A runnable model of `layout` with header values (None: removed), tensor shapes and GGML types replaced."""
    architecture, base_metadata, base_shapes = LAYOUTS[layout]()
    values = base_metadata | factory.tokenizer_metadata(TOKENIZER) | (metadata or {})
    rng = np.random.default_rng(7)
    tensors = {name: Tensor(np.ones(shape, np.float32) if len(shape) == 1 else
                            rng.normal(0.0, 0.02, shape).astype(np.float32), (types or {}).get(name, factory.F32))
               for name, shape in (base_shapes | (shapes or {})).items()}
    return write_gguf(path, architecture, {k: v for k, v in values.items() if v is not None}, tensors)


def power(*args) -> object:
    result = CliRunner().invoke(main, [str(arg) for arg in args])
    assert "Traceback" not in result.output, result.output
    return result


def plan(model: Path, tmp_path: Path, *options: str):
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    manifest = tmp_path / "manifest.toml"
    manifest.write_text('schema = "power.manifest/v1"\nname = "m"\n[target]\npath = '
                        f'"{model.name}"\nsha256 = "{digest}"\n')
    profile = tmp_path / "profile.toml"
    profile.write_text('schema = "power.profile/v1"\nname = "plain"\nspec_mode = "none"\n[runtime]\nctx = 128\n')
    return power("plan", manifest, profile, "--device", "1 GiB", "--json", *options)


def run(model: Path):
    return power("run", "--gguf", model, "--prompt", "Hello world", "--max-tokens", "3", "--ctx", "64", "--json")


def codes(result) -> list[str]:
    return [finding["code"] for finding in json.loads(result.stdout)["findings"]]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_unchanged_layouts_plan_and_run(tmp_path, layout):
    model = write_variant(tmp_path / "model.gguf", layout)
    planned, ran = plan(model, tmp_path), run(model)
    assert planned.exit_code == 0, planned.output
    assert ran.exit_code == 0, ran.output
    assert len(json.loads(ran.stdout)["token_ids"]) >= 1


TOKENS_WITH_BAD_UTF8 = [*TOKENIZER.tokens[:300], b"\xff\xfe", *TOKENIZER.tokens[301:]]

CASES = {
    "attention.head_count = 0": ("dense", {"qwen3.attention.head_count": 0}, None, "PWR123"),
    "attention.head_count is a string": ("dense", {"qwen3.attention.head_count": "four"}, None, "PWR123"),
    "bos_token_id = 2^32-1": ("dense", {"tokenizer.ggml.bos_token_id": 2**32 - 1}, None, "PWR125"),
    "eos_token_id past the vocabulary": ("dense", {"tokenizer.ggml.eos_token_id": TOKENIZER.vocab_size}, None,
                                         "PWR125"),
    "token_embd with 100 rows": ("dense", None, {"token_embd.weight": (100, DENSE.d_model)}, "PWR124"),
    "output with 100 rows": ("dense", None, {"output.weight": (100, DENSE.d_model)}, "PWR124"),
    "a token of invalid UTF-8": ("dense", {"tokenizer.ggml.tokens": TOKENS_WITH_BAD_UTF8}, None, "PWR117"),
    "token types shorter than the tokens": ("dense", {"tokenizer.ggml.token_type": [1] * 10}, None, "PWR124"),
    "sliding_window = 0": ("gemma3", {"gemma3.attention.sliding_window": 0}, None, "PWR123"),
    "block_count = 0": ("dense", {"qwen3.block_count": 0}, None, "PWR123"),
    "block_count below the blocks present": ("dense", {"qwen3.block_count": DENSE.n_layers - 1}, None, "PWR124"),
    "block_count above the blocks present": ("gemma3", {"gemma3.block_count": GEMMA["n_layers"] + 1}, None, "PWR124"),
    "block_count = 2^32-1": ("dense", {"qwen3.block_count": 2**32 - 1}, None, "PWR123"),
    "NaN epsilon": ("dense", {"qwen3.attention.layer_norm_rms_epsilon": float("nan")}, None, "PWR123"),
    "epsilon = 1": ("gemma3", {"gemma3.attention.layer_norm_rms_epsilon": 1.0}, None, "PWR123"),
    "rope base 0": ("dense", {"qwen3.rope.freq_base": 0.0}, None, "PWR123"),
    "infinite rope base": ("gemma3", {"gemma3.rope.freq_base": float("inf")}, None, "PWR123"),
    "NaN logit soft-cap": ("gemma3", {"gemma3.final_logit_softcapping": float("nan")}, None, "PWR123"),
    "KV heads that do not divide the heads": ("dense", {"qwen3.attention.head_count_kv": 3}, None, "PWR124"),
    "full_attention_interval = 0": ("hybrid", {"qwen35.full_attention_interval": 0}, None, "PWR123"),
    "ssm.state_size = 0": ("hybrid", {"qwen35.ssm.state_size": 0}, None, "PWR123"),
    "value heads that do not share key heads": ("hybrid", {"qwen35.ssm.time_step_rank": 3}, None, "PWR124"),
    "rope dimensions past the head width": ("hybrid", {"qwen35.rope.dimension_count": 64}, None, "PWR124"),
    "key_length = 2^32-1": ("dense", {"qwen3.attention.key_length": 2**32 - 1}, None, "PWR124"),
    "value_length = 2^32-1": ("gemma3", {"gemma3.attention.value_length": 2**32 - 1}, None, "PWR124"),
    "K projection narrower than the header's heads": ("gemma3", None, {"blk.0.attn_k.weight": (16, GEMMA["d_model"])},
                                                      "PWR124"),
    # Issue 38 item 12: tensors that contradict embedding_length / head_count were refused only by `power run`.
    "a norm wider than embedding_length": ("dense", None, {"blk.0.attn_norm.weight": (DENSE.d_model + 32,)}, "PWR121"),
    "a down projection writing past embedding_length": ("gemma3", None, {"blk.1.ffn_down.weight":
                                                                         (GEMMA["d_model"] * 2, GEMMA["ffn"])},
                                                                         "PWR121"),
    "an attention output narrower than its heads": ("gemma3", None, {"blk.0.attn_output.weight":
                                                                     (GEMMA["d_model"], GEMMA["head_dim"])}, "PWR121"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_plan_and_run_refuse_the_header_with_a_located_finding(tmp_path, case):
    layout, metadata, shapes, code = CASES[case]
    model = write_variant(tmp_path / "model.gguf", layout, metadata, shapes)

    planned = plan(model, tmp_path)
    assert planned.exit_code == 1, planned.output
    document = json.loads(planned.stdout)
    assert document["plan"] is None and code in codes(planned)
    finding = next(f for f in document["findings"] if f["code"] == code)
    assert finding["file"] == str(model) and finding["where"]
    if finding["where"] in (metadata or {}):  # located at the key's entry in the header
        assert finding["offset"] is not None and finding["offset"] > 0

    ran = run(model)
    assert ran.exit_code == 2, ran.output
    assert codes(ran)[0] == code and "token_ids" not in ran.stdout

    inspected = power("inspect", "--json", "--no-hash", model)
    assert inspected.exit_code == 1 and code in codes(inspected)


def test_a_finding_points_at_the_bytes_of_its_key(tmp_path):
    model = write_variant(tmp_path / "model.gguf", "dense", {"qwen3.rope.freq_base": 0.0})
    [finding] = json.loads(power("inspect", "--json", "--no-hash", model).stdout)["findings"]
    key = b"qwen3.rope.freq_base"
    assert model.read_bytes()[finding["offset"] + 8:][:len(key)] == key  # u64 length, then the key
    text = power("inspect", model)
    assert f"{model}:byte {finding['offset']}: PWR123" in text.stderr


def test_a_per_layer_head_count_plans_but_the_runtime_names_its_own_limit(tmp_path):
    """Per-layer head counts are valid GGUF (llama.cpp reads them); the Power trunks take one value."""
    heads = [DENSE.n_heads] * DENSE.n_layers
    model = write_variant(tmp_path / "model.gguf", "dense", {"qwen3.attention.head_count": heads})
    assert plan(model, tmp_path).exit_code == 0
    ran = run(model)
    assert ran.exit_code == 2 and codes(ran) == ["PWR120"] and "differs per layer" in ran.stderr


def test_a_gguf_with_no_tensors_is_refused_by_plan_and_run(tmp_path):
    """Issue 26 item 10: what the runtime refuses, `plan` refuses first."""
    architecture, metadata, _ = dense_layout()
    model = write_gguf(tmp_path / "model.gguf", architecture, metadata | factory.tokenizer_metadata(TOKENIZER), {})
    planned = plan(model, tmp_path)
    assert planned.exit_code == 1 and "PWR124" in codes(planned) and "no tensors" in planned.stdout
    ran = run(model)
    assert ran.exit_code == 2 and codes(ran)[0] == "PWR124"


def test_an_architecture_name_with_a_nul_is_refused_at_its_key(tmp_path):
    """Issue 38 (low): general.architecture = "qwen3\\0evil" (its keys under that prefix) planned; it prefixes every
    key and is written into plans and launch lines, so plan, run and inspect refuse it at the key."""
    architecture, metadata, shapes = dense_layout()
    named = "qwen3\x00evil"
    values = {key.replace("qwen3.", f"{named}.", 1): value
              for key, value in (metadata | factory.tokenizer_metadata(TOKENIZER)).items()}
    tensors = {name: Tensor(np.ones(shape, np.float32)) for name, shape in shapes.items()}
    model = write_gguf(tmp_path / "model.gguf", named, values, tensors)
    planned = plan(model, tmp_path)
    assert planned.exit_code == 1 and "PWR123" in codes(planned), planned.output
    finding = next(f for f in json.loads(planned.stdout)["findings"] if f["code"] == "PWR123")
    assert finding["where"] == "general.architecture" and finding["offset"] is not None
    assert "PWR123" in codes(power("inspect", "--json", "--no-hash", model))
    assert run(model).exit_code == 2


def forged_plan(good: Path, model: Path, tmp_path: Path, engine: str) -> Path:
    """A plan sealed over `good`, its target then pointed at `model` and re-sealed by hand (as a plan from a Power
    that did not refuse `model` would be)."""
    manifest = tmp_path / "good.manifest.toml"
    manifest.write_text(f'schema = "power.manifest/v1"\nname = "m"\n[target]\npath = "{good.name}"\n'
                        f'sha256 = "{hashlib.sha256(good.read_bytes()).hexdigest()}"\n')
    profile = tmp_path / "good.profile.toml"
    profile.write_text('schema = "power.profile/v1"\nname = "plain"\nspec_mode = "none"\n[runtime]\nctx = 128\n')
    planned = tmp_path / "good.plan.json"
    compiled = power("plan", manifest, profile, "--device", "1 GiB", "--engine", engine, "-o", planned)
    assert compiled.exit_code == 0, compiled.output
    plan_document = load_plan(planned)
    target = plan_document.target.model_copy(update={"path": str(model), "size": model.stat().st_size,
                                                    "sha256": hashlib.sha256(model.read_bytes()).hexdigest()})
    forged = tmp_path / "forged.plan.json"
    save_plan(ResolvedPlan.build(**{**dict(plan_document), "target": target, "digest": ""}), forged)
    return forged


def test_verify_refuses_a_target_whose_tensors_contradict_its_header(tmp_path):
    """Issue 38 item 12: a sealed plan over a model whose attention norm is wider than embedding_length verified
    (exit 0) and only `power run` refused it; verify, the last gate, refuses it for every engine."""
    good = write_variant(tmp_path / "good.gguf", "dense")
    model = write_variant(tmp_path / "model.gguf", "dense", shapes={"blk.0.attn_norm.weight": (DENSE.d_model + 32,)})
    for engine in ("power", "llama-server"):
        verified = power("verify", forged_plan(good, model, tmp_path, engine), "--json")
        assert verified.exit_code == 1, verified.output
        [finding] = json.loads(verified.stdout)["findings"]
        assert (finding["code"], finding["file"], finding["where"]) == ("PWR121", str(model), "blk.0.attn_norm.weight")


def test_plan_and_verify_refuse_a_matrix_type_the_runtime_cannot_read(tmp_path):
    """Issue 38 item 12: a Q4_1 matrix planned for Power's runtime and verified; only `power run` refused it
    (PWR122). llama-server reads Q4_1, so a plan for it still compiles and verifies."""
    up = "blk.0.ffn_up.weight"
    model = write_variant(tmp_path / "model.gguf", "dense", types={up: gguf.GGMLQuantizationType.Q4_1})

    planned = plan(model, tmp_path)
    assert planned.exit_code == 1, planned.output
    finding = next(f for f in json.loads(planned.stdout)["findings"] if f["code"] == "PWR122")
    assert (finding["file"], finding["where"]) == (str(model), up) and "Q4_1" in finding["message"]
    ran = run(model)
    assert ran.exit_code == 2 and codes(ran)[0] == "PWR122", ran.output
    assert plan(model, tmp_path, "--engine", "llama-server").exit_code == 0

    good = write_variant(tmp_path / "good.gguf", "dense")
    verified = power("verify", forged_plan(good, model, tmp_path, "power"), "--json")
    assert verified.exit_code == 1 and codes(verified) == ["PWR122"], verified.output
    assert power("verify", forged_plan(good, model, tmp_path, "llama-server")).exit_code == 0


def test_the_runtime_reads_exactly_the_types_its_plans_allow():
    assert set(RUNTIME_TYPES) == set(BLOCK_LAYOUT) == set(CPU_TYPES)


def write_dflash_drafter(path: Path, types: dict | None = None) -> Path:
    """The factory's DFlash drafter for the hybrid fixture target, its matrices in F32 but for `types`."""
    hp = factory.fixture_drafter_hparams(modes.DFLASH)
    rng = np.random.default_rng(11)
    tensors = {name: Tensor(np.ones(shape, np.float32) if len(shape) == 1 else
                            rng.normal(0.0, 0.02, shape).astype(np.float32), (types or {}).get(name, factory.F32))
               for name, shape in contracts.drafter_tensors(modes.DFLASH, hp).items()}
    metadata = contracts.drafter_metadata(modes.DFLASH, hp) | factory.tokenizer_metadata(TOKENIZER)
    return write_gguf(path, modes.ARCHITECTURE_OF[modes.DFLASH], metadata, tensors)


def test_plan_and_verify_refuse_a_drafter_matrix_type_the_runtime_cannot_read(tmp_path):
    """Issue 40 (noticed): PWR122 checked the target's tensors only, so a GGUF drafter with a Q4_1 matrix planned
    for Power's runtime and verified, and only its load refused it. Plan and verify now refuse it in the drafter."""
    target = fixtures()["hybrid-target"]
    good = write_dflash_drafter(tmp_path / "good-drafter.gguf")
    matrix = next(name for name, shape in contracts.drafter_tensors(
        modes.DFLASH, factory.fixture_drafter_hparams(modes.DFLASH)).items() if len(shape) == 2)
    bad = write_dflash_drafter(tmp_path / "drafter.gguf", types={matrix: gguf.GGMLQuantizationType.Q4_1})

    def manifest(drafter: Path) -> Path:
        path = tmp_path / f"{drafter.stem}.manifest.toml"
        target_sha256 = sha256_file(target, progress=False)
        path.write_text(f'schema = "power.manifest/v1"\nname = "m"\n[target]\npath = "{target}"\n'
                        f'sha256 = "{target_sha256}"\n[[drafters]]\nkind = "dflash"\npath = "{drafter}"\n'
                        f'sha256 = "{sha256_file(drafter, progress=False)}"\ntarget_sha256 = "{target_sha256}"\n')
        return path

    profile = tmp_path / "dflash.profile.toml"
    profile.write_text('schema = "power.profile/v1"\nname = "dflash"\nspec_mode = "dflash"\n'
                       'spec_draft_max = 3\n[runtime]\nctx = 128\n')
    planned = power("plan", manifest(bad), profile, "--device", "1 GiB", "--json")
    assert planned.exit_code == 1, planned.output
    [finding] = [f for f in json.loads(planned.stdout)["findings"] if f["severity"] == "error"]
    assert (finding["code"], finding["file"], finding["where"]) == ("PWR122", str(bad),
                                                                    matrix) and "Q4_1" in finding["message"]

    sealed = tmp_path / "good.plan.json"
    made = power("plan", manifest(good), profile, "--device", "1 GiB", "-o", sealed)
    assert made.exit_code == 0, made.output
    plan_document = load_plan(sealed)
    [drafter] = plan_document.drafters
    swapped = drafter.model_copy(update={"path": str(bad), "size": bad.stat().st_size,
                                         "sha256": sha256_file(bad, progress=False)})
    forged = tmp_path / "forged.plan.json"
    save_plan(ResolvedPlan.build(**{**dict(plan_document), "drafters": (swapped,), "digest": ""}), forged)
    verified = power("verify", forged, "--json")
    assert verified.exit_code == 1 and codes(verified) == ["PWR122"], verified.output
