"""`power drafter distill`: the trained forward is the runtime's, and every stage runs on a fixture target.

generate -> train -> export -> plan -> verify -> run, with greedy output equal to the target alone. The
acceptance and speed a real distillation reaches are measured by bench/bench_drafter.py, not here.
"""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from gguf_helpers import fixtures
from plan_helpers import write_manifest

from power.app.cli import main
from power.artifacts.contracts import DFLASH, DSPARK
from power.documents.plan import load_plan
from power.drafters.distill import DistillRequest, drafter_shape
from power.drafters.export import write_drafter
from power.drafters.generate import NO_LABEL, Example, corpus_examples, load_prompts
from power.drafters.model import BlockDrafterNet
from power.drafters.train import block_targets
from power.runtime.engine import Engine, Workload
from power.runtime.gguf_weights import GGUFFile
from power.runtime.speculators import registry
from power.runtime.speculators.base import SpeculatorRequest
from power.runtime.tokenizer import Tokenizer
from power.runtime.trunks import load_trunk


def dense():
    return fixtures()["dense-target"]


@pytest.mark.parametrize("kind", [DFLASH, DSPARK])
def test_the_trained_block_rows_are_the_runtime_drafters_rows(tmp_path, kind):
    target = GGUFFile(dense())
    hp = drafter_shape(DistillRequest(dense(), kind, tmp_path), target)
    net = BlockDrafterNet(kind, hp, target.tensor("token_embd.weight"), target.tensor("output.weight"), 64, seed=3)
    path = write_drafter(tmp_path / "d.gguf", kind, hp, net.tensors(), dense(), "test")
    trunk = load_trunk(dense(), n_ctx=64, verify_capacity=hp.block_size)
    drafter = registry.create(kind, SpeculatorRequest(trunk, target, GGUFFile(path)))
    tokens = [5, 77, 300, 12, 9, 140, 201, 33, 60, 2]
    out = trunk.prefill(tokens[:-1], drafter.taps)
    drafter.commit(tokens[:-1], out.hidden, 0)
    features = torch.cat([out.hidden[t] for t in hp.target_layers], dim=-1)
    features = torch.cat([features, torch.zeros(1, features.shape[1])])  # the anchor's row is never read
    trained = net.rows(features, torch.tensor(tokens), torch.tensor([len(tokens) - 1]))[0].detach()
    torch.testing.assert_close(trained, drafter._block(tokens[-1]), atol=2e-2, rtol=2e-2)


def test_packaged_prompts_keep_the_held_out_topics_apart():
    train = {p.text for p in load_prompts(which="train")}
    held = load_prompts(which="heldout")
    assert len(train) >= 300 and {p.shape for p in held} == {"prose", "list", "chat", "code"}
    assert not train & {p.text for p in held}


def test_distill_plan_verify_and_run_with_greedy_parity(tmp_path):
    manifest = write_manifest(tmp_path, "dense-target", [], name="fixture")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"shape": "prose", "prompt": f"Story {i}: once upon a time"}) + "\n"
                               for i in range(12)))
    out = tmp_path / "drafter"
    runner = CliRunner()
    distilled = runner.invoke(main, ["drafter", "distill", str(manifest), "--kind", "dflash", "--fr", "400",
                                     "--budget", "5m", "--prompts", str(prompts), "--max-new-tokens", "12",
                                     "--steps", "3", "--slots", "4", "--quiet", "-o", str(out)])
    assert distilled.exit_code == 0, distilled.output
    report = json.loads((out / "distill.json").read_text())
    assert report["steps"] == 3 and report["sequences"] == 12 and report["fr"] == 400
    plan_path = tmp_path / "plan.toml"
    planned = runner.invoke(main, ["plan", str(out / "manifest.toml"), str(out / "profile.toml"), "--device", "8 GiB",
                                   "-o", str(plan_path)])
    assert planned.exit_code == 0, planned.output
    verified = runner.invoke(main, ["verify", str(plan_path)])
    assert verified.exit_code == 0, verified.output
    plan = load_plan(plan_path)
    assert plan.mode.resolved == "dflash" and plan.speculation.fr_vocab_size == 400
    speculative = Engine(Workload.of_plan(plan, plan_path))
    plain = Engine(Workload.of_gguf(dense()))
    for prompt in ("Story 99: once upon a time", "The quick brown fox"):
        drafted = speculative.generate(prompt, 24)
        assert drafted.token_ids == plain.generate(prompt, 24).token_ids
        assert drafted.proposed > 0


def test_a_rerun_resumes_from_the_checkpoint(tmp_path):
    manifest = write_manifest(tmp_path, "dense-target", [], name="fixture")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"Line {i} of the tale" for i in range(10)) + "\n")
    args = ["drafter", "distill", str(manifest), "--kind", "dspark", "--prompts", str(prompts), "--max-new-tokens",
            "8", "--slots", "2", "--quiet", "--seed", "7", "-o"]
    first = CliRunner().invoke(main, [*args, str(tmp_path / "a"), "--steps", "2"])
    assert first.exit_code == 0, first.output
    resumed = CliRunner().invoke(main, [*args, str(tmp_path / "a"), "--steps", "4"])
    straight = CliRunner().invoke(main, [*args, str(tmp_path / "b"), "--steps", "4"])
    assert resumed.exit_code == 0 and straight.exit_code == 0, resumed.output + straight.output
    a, b = (json.loads((tmp_path / d / "distill.json").read_text()) for d in "ab")
    assert a["steps"] == b["steps"] == 4 and a["acceptance"] == b["acceptance"]
    assert (tmp_path / "a" / "dense-target-dspark.gguf").exists()


def test_a_block_counts_only_while_the_text_is_the_targets_own_greedy_path():
    example = Example(tokens=torch.tensor([1, 2, 3, 4, 5]), labels=torch.tensor([2, 3, 9, 5, NO_LABEL]),
                      features=torch.zeros(5, 4))
    target, valid = block_targets(example, torch.tensor([0, 3]), block_size=5)
    assert target[0].tolist() == [2, 3, 9, 5]
    assert valid[0].tolist() == [True, True, True, False]  # the text left the target's path after 3 (4, not 9)
    assert valid[1].tolist() == [True, False, False, False]  # past the last label and past the text


def test_corpus_rows_are_the_targets_own_argmax_and_taps():
    text = "Once upon a time a fox ran across the quiet field and into the wood. " * 3
    trunk = load_trunk(dense(), n_ctx=64, verify_capacity=1)
    tokenizer = Tokenizer.from_gguf(GGUFFile(dense()))
    examples = corpus_examples(trunk, tokenizer, [text], taps=(1, 3), window=16, progress=False)
    assert examples and all(len(e.tokens) == len(e.labels) == len(e.features) for e in examples)
    reference = load_trunk(dense(), n_ctx=64, verify_capacity=1).prefill(examples[1].tokens.tolist(), (1, 3), True)
    assert torch.equal(examples[1].labels, reference.logits.argmax(dim=-1))
    assert torch.equal(examples[1].features, torch.cat([reference.hidden[1], reference.hidden[3]], -1).bfloat16())
