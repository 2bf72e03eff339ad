"""`power run`: a plan or a GGUF in, streamed text and a receipt out; bad input is exit 2 with a named cause."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct

import gguf
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from gguf_helpers import fixtures
from plan_helpers import compiled, write_manifest, write_profile

from power.app.cli import main
from power.documents.plan import save_plan
from power.kernels.cpu import chosen_path

pytestmark = pytest.mark.slow  # outside `scripts/test --fast`: interpreter-heavy or runs the real model for long


def run(*args: str):
    return CliRunner().invoke(main, ["run", *args])


def dense() -> str:
    return str(fixtures()["dense-target"])


def test_json_receipt_carries_the_stream_its_digest_and_zero_speculation_counters():
    result = run("--gguf", dense(), "--prompt", "The quick brown fox", "--max-tokens", "6", "--json")
    assert result.exit_code == 0, result.output
    receipt = json.loads(result.stdout)
    assert receipt["schema"] == "power.receipt/v1"
    assert 1 <= len(receipt["token_ids"]) <= 6
    assert receipt["tokens_sha256"] == hashlib.sha256(struct.pack(f"<{len(receipt['token_ids'])}I",
                                                                  *receipt["token_ids"])).hexdigest()
    with open(dense(), "rb") as handle:
        assert receipt["artifacts"] == {dense(): hashlib.sha256(handle.read()).hexdigest()}
    assert all(receipt[key] == 0 for key in ("proposed", "accepted", "replays", "clamps", "fallbacks"))
    assert receipt["rounds"] == len(receipt["token_ids"]) - 1 or receipt["stop_reason"] == "stop"
    assert receipt["plan_digest"] is None and receipt["prefill_tok_s"] > 0
    assert receipt["stop_reason"] in ("length", "stop")


def test_a_stop_string_ends_the_run_before_it_and_the_receipt_says_stop():
    full = json.loads(run("--gguf", dense(), "--prompt", "Hello world", "--max-tokens", "12", "--json").stdout)
    stop = full["text"][len(full["text"]) // 2:][:3]
    assert stop.strip(), full["text"]
    result = run("--gguf", dense(), "--prompt", "Hello world", "--max-tokens", "12", "--stop", stop)
    as_json = json.loads(run("--gguf", dense(), "--prompt", "Hello world", "--max-tokens", "12", "--stop", stop,
                             "--json").stdout)
    assert result.exit_code == 0, result.output
    assert as_json["stop_reason"] == "stop" and as_json["text"] == full["text"][:full["text"].index(stop)]
    assert result.stdout == as_json["text"] + "\n"


def test_streamed_text_is_the_receipts_text():
    streamed = run("--gguf", dense(), "--prompt", "Hello world", "--max-tokens", "8")
    as_json = run("--gguf", dense(), "--prompt", "Hello world", "--max-tokens", "8", "--json")
    assert streamed.exit_code == as_json.exit_code == 0
    assert streamed.stdout == json.loads(as_json.stdout)["text"] + "\n"
    assert "tokens sha256" in streamed.stderr


def test_a_plan_runs_and_its_digest_lands_in_the_receipt(tmp_path):
    manifest = write_manifest(tmp_path, "dense-target")
    profile = write_profile(tmp_path, "none", runtime={"ctx": 256, "verify_capacity": 5})
    plan, findings = compiled(manifest, profile)
    assert plan is not None, findings
    save_plan(plan, tmp_path / "plan.json")
    receipt_file = tmp_path / "receipt.json"
    result = run(str(tmp_path / "plan.json"), "--prompt", "Hello", "--max-tokens", "4", "--json",
                 "--receipt", str(receipt_file))
    assert result.exit_code == 0, result.output
    receipt = json.loads(result.stdout)
    assert receipt["plan_digest"] == plan.digest
    assert receipt["runtime"]["verify_capacity"] == 5 and receipt["runtime"]["n_ctx"] == 256
    assert json.loads(receipt_file.read_text()) == receipt


def test_a_changed_artifact_fails_the_plan_closed(tmp_path):
    target = tmp_path / "dense.gguf"
    shutil.copy(dense(), target)
    manifest = write_manifest(tmp_path, "dense-target")
    manifest.write_text(manifest.read_text().replace(dense(), str(target)))
    plan, findings = compiled(manifest, write_profile(tmp_path, "none"))
    assert plan is not None, findings
    save_plan(plan, tmp_path / "plan.json")
    with open(target, "ab") as handle:
        handle.write(b"\0" * 32)
    result = run(str(tmp_path / "plan.json"), "--prompt", "Hello", "--json")
    assert result.exit_code == 2
    assert "sha256" in result.stderr and "re-plan" in result.stderr
    assert [f["code"] for f in json.loads(result.stdout)["findings"]] == ["PWR115"]  # no receipt, only the refusal


def _gguf(path, architecture: str, tensors: dict[str, np.ndarray], metadata: dict | None = None) -> str:
    writer = gguf.GGUFWriter(str(path), architecture)
    for key, value in (metadata or {}).items():
        (writer.add_float32 if isinstance(value, float) else writer.add_uint32)(key, value)
    for name, values in tensors.items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


@pytest.mark.parametrize("case,needle", [
    ("architecture", "architecture 'mamba' is not implemented"),
    ("missing", "tensor 'token_embd.weight' is missing"),
    ("shape", "its residual-stream side is 4 wide, but llama.embedding_length is 8"),
    ("context", "the prompt is"),
    ("usage", "give exactly one of PLAN or --gguf"),
    ("no such device", "\n  hint: use a CUDA build of torch on a machine with that GPU, or --device cpu"),
    ("unknown device", "device 'tpu' is not supported\n  hint: choose auto, cpu, cuda or cuda:N"),
])
def test_bad_input_exits_2_naming_the_cause_without_a_traceback(tmp_path, case, needle):
    if case == "architecture":
        args = ["--gguf", _gguf(tmp_path / "m.gguf", "mamba", {"x": np.ones(4, dtype=np.float32)})]
    elif case in ("missing", "shape"):
        meta = {f"llama.{k}": v for k, v in (("embedding_length", 8), ("block_count", 1), ("feed_forward_length", 16),
                                             ("attention.head_count", 2), ("attention.layer_norm_rms_epsilon", 1e-6))}
        tensors = {"blk.0.attn_norm.weight": np.ones(4 if case == "shape" else 8, dtype=np.float32)}
        if case == "shape":
            tensors["token_embd.weight"] = np.ones((16, 8), dtype=np.float32)
        args = ["--gguf", _gguf(tmp_path / "l.gguf", "llama", tensors, meta)]
    elif case == "context":
        args = ["--gguf", dense(), "--ctx", "4"]
    elif case == "no such device":  # one past the last CUDA device torch sees, on any machine
        args = ["--gguf", dense(), "--device", f"cuda:{torch.cuda.device_count()}"]
    elif case == "unknown device":
        args = ["--gguf", dense(), "--device", "tpu"]
    else:
        args = []
    result = run(*args, "--prompt", "The quick brown fox jumps over the lazy dog", "--max-tokens", "3")
    assert result.exit_code == 2, result.output
    assert needle in result.stderr and "Traceback" not in result.output
    assert result.stdout == ""


@pytest.mark.parametrize("arithmetic", ["auto", "float32"])
def test_a_speculative_plan_runs_in_its_mode_and_emits_the_plain_greedy_stream(tmp_path, arithmetic):
    """A plan's arithmetic decides the tokens; a plan-less run takes the default plan's (auto: quantised)."""
    manifest = write_manifest(tmp_path, "dense-target", drafters=[{"kind": "ngram"}])
    profile = write_profile(tmp_path, "ngram", k=3, s=3, runtime={"ctx": 256, "verify_capacity": 4,
                                                                  "arithmetic": arithmetic})
    plan, findings = compiled(manifest, profile)
    assert plan is not None, findings
    save_plan(plan, tmp_path / "plan.json")
    prompt = "Hello world! Hello world! Hello world! Hello world!"
    speculative = run(str(tmp_path / "plan.json"), "--prompt", prompt, "--max-tokens", "12", "--json")
    assert speculative.exit_code == 0, speculative.output
    spec = json.loads(speculative.stdout)
    resolved = "quantised" if arithmetic == "auto" else arithmetic
    assert plan.runtime.arithmetic == spec["runtime"]["arithmetic"] == resolved
    assert spec["mode"] == "ngram" and spec["rounds"] >= 1
    assert spec["runtime"]["real_rows"] == (resolved == "quantised")
    runtime = spec["runtime"]  # CUDA graphs are a CUDA device's: planned, and not what ran on the CPU
    assert (runtime["cuda_graphs_planned"], runtime["cuda_graphs"], runtime["cuda_graph_rows"]) == (True, False, [])
    assert spec["runtime"]["instruction_path"] == (chosen_path() if resolved == "quantised" else "torch-float32")
    if resolved == "quantised":  # a plan-less run is a default plan's arithmetic: the same tokens
        plain = run("--gguf", dense(), "--verify-capacity", "4", "--ctx", "256", "--prompt", prompt, "--max-tokens",
                    "12", "--json")
        assert plain.exit_code == 0, plain.output
        assert spec["token_ids"] == json.loads(plain.stdout)["token_ids"]  # greedy speculation is exact


def test_no_command_line_option_changes_the_arithmetic():
    result = run("--gguf", dense(), "--prompt", "Hello", "--max-tokens", "2", "--dtype", "float32")
    assert result.exit_code == 2 and "No such option '--dtype'" in result.output
