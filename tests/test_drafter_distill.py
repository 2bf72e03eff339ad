"""`power drafter distill`: the trained forward is the runtime's, and every stage runs on a fixture target.

generate -> train -> export -> plan -> verify -> run, with greedy output equal to the target alone, for a block
drafter (DFlash on the dense fixture) and an MTP head (on the gemma3 fixture). The acceptance and speed a real
distillation reaches are measured by bench/bench_drafter.py, not here.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from gguf_helpers import fixtures, gemma
from plan_helpers import write_manifest
from spec_helpers import copying_mtp_sidecar, plain_stream, prompt_for

from power.app.cli import main
from power.artifacts.contracts import declared_draft_tokens
from power.documents.plan import load_plan
from power.drafters.distill import DistillRequest, TrainingData, drafter_shape
from power.drafters.export import (
    BLOCK_MATRICES,
    CHAINED_NGRAM_MATCH,
    MTP_MATRICES,
    stored,
    write_drafter,
    write_mtp_sidecar,
)
from power.drafters.generate import NO_LABEL, NOT_SCORED, Example, corpus_examples
from power.drafters.model import BlockDrafterNet, block_targets, expected_accepted
from power.drafters.mtp_head import MTPHeadNet, chain_accepted, chain_targets
from power.drafters.progress import BudgetBar
from power.drafters.prompt_sets import NONREPEATING_COPYABLE, copyable, load_prompts, longest_repeat
from power.drafters.served import replay
from power.drafters.train import Curve, laid_rounds, training_precision
from power.drafters.worth import Costs
from power.modes import DFLASH, DFLASH2, DSPARK, MTP, NGRAM
from power.orchestrator.planning.worth_it import judge_distilled
from power.runtime.decoder import Decoder
from power.runtime.engine import Engine, EngineOptions
from power.runtime.gguf_weights import GGUFFile
from power.runtime.layers import rms_norm
from power.runtime.sampling import Sampler, SamplingParams
from power.runtime.scheduler import SchedulerConfig
from power.runtime.speculators import registry
from power.runtime.speculators.base import DraftContext, Speculator, SpeculatorRequest
from power.runtime.speculators.dflash import header_view
from power.runtime.tokenizer import Tokenizer
from power.runtime.trunks import load_trunk
from power.runtime.trunks.gemma3 import Gemma3Params
from power.runtime.workload import Workload


def dense():
    return fixtures()["dense-target"]


def gemma3():
    return fixtures()["gemma3-target"]


def _shaken(net: BlockDrafterNet) -> None:
    """DFlash2's convolutions and selector away from their identity start (deltas and codebooks that matter)."""
    generator = torch.Generator().manual_seed(5)
    for name in net.names:
        if "_conv_" in name or name.startswith("selector_"):
            value = net.tensor(name)
            value.data.add_(
                torch.randn(value.shape, generator=generator) * (1.0 if name.startswith("selector_") else 0.2)
            )


@pytest.mark.parametrize("kind", [DFLASH, DSPARK, DFLASH2])
def test_the_trained_block_rows_are_the_runtime_drafters_rows(tmp_path, kind):
    target = GGUFFile(dense())
    hp = drafter_shape(DistillRequest(dense(), kind, tmp_path), target)
    net = BlockDrafterNet(kind, hp, target.tensor("token_embd.weight"), target.tensor("output.weight"), 64, seed=3)
    _shaken(net)
    path = write_drafter(tmp_path / "d.gguf", kind, hp, net.tensors(), dense(), "test")
    trunk = load_trunk(dense(), n_ctx=64, verify_capacity=hp.block_size)
    drafter = registry.create(kind, SpeculatorRequest(trunk, target, GGUFFile(path)))
    tokens = [5, 77, 300, 12, 9, 140, 201, 33, 60, 2]
    out = trunk.prefill(tokens[:-1], drafter.taps)
    drafter.commit(tokens[:-1], out.hidden, 0)
    drafter._catch_up()  # a proposal would run the queued rows first
    features = torch.cat([out.hidden[t] for t in hp.target_layers], dim=-1)
    features = torch.cat([features, torch.zeros(1, features.shape[1])])  # the anchor's row is never read
    trained = net.rows(features, torch.tensor(tokens), torch.tensor([len(tokens) - 1]))[0].detach()
    torch.testing.assert_close(trained, drafter._block(tokens[-1]), atol=2e-2, rtol=2e-2)


def test_the_trained_dflash2_selector_picks_what_the_runtime_walk_picks(tmp_path):
    """From the same block rows, the trained unary term is the runtime's (the target head's logits; the runtime's
    products quantise activations to int8, a percent off), and the trained selector, fed the runtime's unary term and
    the walk's own predecessors (the anchor, then each pick), picks every token the runtime's greedy walk picks."""
    target = GGUFFile(dense())
    hp = drafter_shape(DistillRequest(dense(), DFLASH2, tmp_path), target)
    vocabulary = torch.arange(400).flip(0)  # a draft vocabulary in another order than the IDs
    net = BlockDrafterNet(DFLASH2, hp, target.tensor("token_embd.weight"), target.tensor("output.weight")[vocabulary],
                          64, seed=4, draft_tokens=vocabulary)
    _shaken(net)
    path = write_drafter(tmp_path / "d.gguf", DFLASH2, hp, net.tensors(), dense(), "test", vocabulary.tolist())
    for name, value in stored(net.tensors(), BLOCK_MATRICES).items():  # the float16 the file stores
        net.tensor(name).data.copy_(value)
    trunk = load_trunk(dense(), n_ctx=64, verify_capacity=hp.block_size)
    drafter = registry.create(DFLASH2, SpeculatorRequest(trunk, target, GGUFFile(path)))
    tokens = [5, 77, 300, 12, 9, 140, 201, 33, 60, 2]
    drafter.commit(tokens[:-1], trunk.prefill(tokens[:-1], drafter.taps).hidden, 0)
    drafter._catch_up()
    rows = drafter._block(tokens[-1])[1:]
    walk = drafter._selector_walk(tokens[-1], rows)
    unary = drafter._unary(drafter.head.draft_logits(rows))
    torch.testing.assert_close(net.unary(rows).detach(), unary, atol=0.05, rtol=0.05)
    picked = vocabulary[net.selected(unary, rows, torch.tensor([tokens[-1], *walk[:-1]]))].tolist()
    assert picked == walk
    assert picked != vocabulary[unary.argmax(-1)].tolist()  # the transition term changed some picks


def test_the_acceptance_estimate_is_one_plus_the_sum_of_the_accuracy_products_over_the_rounds_serving_lays():
    """A prompt of 2 tokens, then 9 generated; a round anchored at positions 2..9 accepts 4, 3, 2, 1, 0, 0, 0, 0 drafts
    and position 10 cannot be scored. At K = 4 serving lays rounds at 2 (4 drafts), 7, 8 and 9 (none), then steps
    over 10: accuracies per position 1/4, 1/1, 1/1, 1/1 and an estimate of 1 + 4 x 1/4 = 1 + the mean 1 accepted,
    where every anchor alike would say 1 + 10/8. At K = 1 the rounds are at 2, 4, 6, 7, 8 and 9."""
    example = Example(torch.zeros(11, dtype=torch.long), torch.tensor([NO_LABEL] + [7] * 10), torch.zeros(11, 1))
    accepted = torch.tensor([NOT_SCORED, NOT_SCORED, 4, 3, 2, 1, 0, 0, 0, 0, NOT_SCORED])
    assert example.first_generated == 2
    assert laid_rounds(accepted, example.first_generated, 4).tolist() == [4, 0, 0, 0]
    assert laid_rounds(accepted, example.first_generated, 1).tolist() == [1, 1, 0, 0, 0, 0]
    curve = Curve.empty(4)
    curve.add(accepted, example.first_generated)
    assert curve.laid[4].per_position() == pytest.approx([1 / 4, 1.0, 1.0, 1.0])
    assert curve.estimate(4) == pytest.approx(2.0) and curve.estimate(1) == pytest.approx(1 + 2 / 6)
    assert curve.mean_accepted(4) == pytest.approx(10 / 8) and curve.per_position()[0] == pytest.approx(4 / 8)
    document = curve.to_json()
    assert document["blocks"] == 8 and document["estimate"]["4"] == 2.0 and document["estimate_rounds"]["4"] == 4


def test_the_expected_accepted_drafts_multiply_the_probabilities_of_the_targets_tokens_up_to_a_rounds_end():
    """Block 1 gives the target's tokens probabilities 1/2, 1/2, 1/4: it accepts 1/2 + 1/4 + 1/16 drafts in
    expectation. Block 2's second row does not count (a label the draft vocabulary lacks), so its round ends there:
    1/2, and its third row, though it counts for the cross-entropy, gets no gradient from the expectation."""
    probabilities = torch.tensor([[0.5, 0.5 / 3, 0.5 / 3, 0.5 / 3], [0.5, 0.5 / 3, 0.5 / 3, 0.5 / 3],
                                  [0.25, 0.25, 0.25, 0.25], [0.5, 0.5 / 3, 0.5 / 3, 0.5 / 3],
                                  [0.9, 0.1 / 3, 0.1 / 3, 0.1 / 3]])
    logits = probabilities.log().requires_grad_()
    valid = torch.tensor([[True, True, True], [True, False, True]])
    expected = expected_accepted(logits, torch.zeros(5, dtype=torch.long), valid)
    assert float(expected.detach()) == pytest.approx((0.5 + 0.25 + 0.0625 + 0.5) / 2)
    expected.backward()
    assert logits.grad is not None and torch.count_nonzero(logits.grad[4]) == 0
    assert torch.count_nonzero(logits.grad[:4].abs() > 1e-6) > 0


@dataclass
class _Rounds(Speculator):
    """A speculator that notes each round's anchor position and drafts."""

    inner: Speculator
    rounds: list[tuple[int, list[int]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.name, self.taps, self.max_proposals = self.inner.name, self.inner.taps, self.inner.max_proposals

    def begin(self, tokens):
        self.inner.begin(tokens)

    def propose(self, ctx):
        proposal = self.inner.propose(ctx)
        self.rounds.append((len(ctx.tokens) - 1, proposal.tokens[: ctx.max_tokens]))
        return proposal

    def commit(self, tokens, hidden, start):
        self.inner.commit(tokens, hidden, start)

    def reset(self):
        self.inner.reset()

    def checkpoint(self):
        return self.inner.checkpoint()

    def restore(self, checkpoint):
        self.inner.restore(checkpoint)


@pytest.mark.parametrize("k", [2, 4])
def test_the_served_replay_accepts_what_a_greedy_decode_at_k_accepts(k):
    """The replay of the target's greedy text (power.drafters.served) lays its rounds where the runtime's decoder lays
    them and accepts in each what verification accepts, for a head that lands some chains and misses others."""
    sidecar, prompt = copying_mtp_sidecar(), prompt_for("gemma3")
    target = GGUFFile(gemma3())
    trunk = load_trunk(target, n_ctx=128, verify_capacity=k + 1)
    recorded = _Rounds(registry.create(MTP, SpeculatorRequest(trunk, target, GGUFFile(sidecar))))
    generated = (
        Decoder(trunk, Sampler(SamplingParams()), recorded, SchedulerConfig(k=k, s=k)).generate(prompt, 40).tokens
    )
    text = prompt + generated
    decoded = [next((i for i, d in enumerate(drafts) if d != text[anchor + 1 + i]), len(drafts))
               for anchor, drafts in recorded.rounds if anchor + k < len(text)]
    example = Example(torch.tensor(text[:-1]), torch.tensor([NO_LABEL] * (len(prompt) - 1) + generated),
                      torch.zeros(len(text) - 1, 1, dtype=torch.bfloat16))
    served = replay(gemma3(), sidecar, MTP, [example], [k])
    assert served.accepted[k] == decoded and 0 < sum(decoded) < k * len(decoded)
    assert served.tokens_per_round(k) == pytest.approx(1 + sum(decoded) / len(decoded))


@pytest.mark.parametrize("target", ["dense-target", "llama-target", "qwen2-target", "hybrid-target"])
def test_an_mtp_head_for_an_architecture_without_a_layout_is_refused_before_anything_is_written(tmp_path, target):
    manifest = write_manifest(tmp_path, target, [], name="fixture")
    out = tmp_path / "drafter"
    result = CliRunner().invoke(main, ["drafter", "distill", str(manifest), "--kind", "mtp", "--quiet", "-o", str(out)])
    assert result.exit_code == 2
    assert "PWR219" in result.output and "gemma3, qwen35" in result.output and "--kind dflash" in result.output
    assert not out.exists() or not any(out.iterdir())


def test_the_trained_mtp_chain_is_the_runtime_heads_chain(tmp_path):
    """Every level of the trained chain against the runtime head fed the same tokens, after an exported round trip."""
    target = GGUFFile(gemma3())
    p = Gemma3Params.from_gguf(target)
    embedding = target.tensor("token_embd.weight")
    net = MTPHeadNet(p, embedding, embedding, max_positions=64, seed=3)
    for name, value in stored(net.tensors(), MTP_MATRICES).items():  # the Q8_0 the sidecar stores
        net.tensor(name).data.copy_(value)
    path = write_mtp_sidecar(tmp_path / "mtp.gguf", net.tensors(), gemma3(), "test")
    trunk = load_trunk(target, n_ctx=64, verify_capacity=1)
    head = registry.create(MTP, SpeculatorRequest(trunk, target, GGUFFile(path)))
    tokens = [5, 77, 300, 12, 9, 140, 201, 33, 60, 2, 44, 55]
    hidden = trunk.prefill(tokens, head.taps).hidden[head.taps[0]]
    levels = net.chain(hidden, torch.tensor(tokens), 3)
    anchor = 6
    head.commit(tokens[:anchor], {head.taps[0]: hidden[:anchor]}, 0)
    head._catch_up()  # a proposal would run the queued rows first; the levels below are fed the text's tokens
    h = head.last_hidden
    for level, (rows, trained) in enumerate(levels):
        y = head._step([tokens[anchor + level]], h[None], anchor + level)  # the chain, fed the text's tokens
        row = int((rows == anchor + level - 1).nonzero()[0, 0])
        # the runtime quantises each activation block to int8 as llama.cpp's CPU product does: a percent or two
        torch.testing.assert_close(trained[row].detach(), rms_norm(y, head.head_norm, p.eps)[0], atol=5e-2, rtol=5e-2)
        h = y[0]


@pytest.mark.parametrize("ranked", [False, True], ids=["every-id", "draft-vocabulary"])
def test_held_back_chains_are_counted_as_verification_counts_them(tmp_path, ranked):
    """Each chain's accepted length from the trained module equals the runtime head's proposal matched against the
    target's greedy text, anchor by anchor (a head that drafts its input token: some chains land, some miss), over
    every token ID or over a draft vocabulary that lacks some of the text's tokens."""
    target, sidecar = GGUFFile(gemma3()), GGUFFile(copying_mtp_sidecar())
    tokens = prompt_for("gemma3") + list(plain_stream("gemma3", 40))
    embedding = target.tensor("token_embd.weight")
    vocabulary = None
    if ranked:
        seen = sorted(set(tokens))
        vocabulary = torch.tensor(seen[::-2] + [i for i in range(64) if i not in seen])  # half the text's tokens
        weights = {name: sidecar.tensor(name) for name in sidecar.tensors}
        sidecar = GGUFFile(
            write_mtp_sidecar(tmp_path / "ranked.gguf", weights, gemma3(), "ranked", vocabulary.tolist())
        )
    trunk = load_trunk(target, n_ctx=128, verify_capacity=1)
    head = registry.create(MTP, SpeculatorRequest(trunk, target, sidecar))
    out = trunk.prefill(tokens, head.taps, all_logits=True)
    hidden = out.hidden[head.taps[0]]
    example = Example(torch.tensor(tokens), out.logits.argmax(dim=-1), hidden)
    p = Gemma3Params.from_gguf(target)
    net = MTPHeadNet(p, embedding, embedding if vocabulary is None else embedding[vocabulary], len(tokens), seed=0,
                     start={name: sidecar.tensor(name) for name in sidecar.tensors}, draft_tokens=vocabulary)
    k = 4
    labels, valid = chain_targets(example, k)
    counted = []
    for anchor in range(1, len(tokens) - k + 1):  # its first draft is row anchor - 1's
        if valid[k - 1, anchor + k - 2]:
            head.reset()
            head.commit(tokens[:anchor], {head.taps[0]: hidden[:anchor]}, 0)
            drafts = head.propose(DraftContext(tokens[:anchor + 1], k)).tokens
            hits = [d == t for d, t in zip(drafts, labels[anchor - 1:anchor - 1 + k].tolist(), strict=True)]
            counted.append(hits.index(False) if False in hits else k)
    assert [a for a in chain_accepted(net, example, k).tolist() if a != NOT_SCORED] == counted
    assert 0 < sum(counted) < k * len(counted)


def test_a_chain_level_counts_only_while_the_text_is_the_targets_own_greedy_path():
    example = Example(tokens=torch.tensor([1, 2, 3, 4, 5, 6]), labels=torch.tensor([NO_LABEL, 3, 4, 9, 6, NO_LABEL]),
                      features=torch.zeros(6, 4))
    labels, valid = chain_targets(example, levels=3)
    assert labels.tolist() == [3, 4, 9, 6, NO_LABEL]  # the target's token after positions 1..5
    assert valid[0].tolist() == [True, True, True, True, False]  # every labelled position, from its own anchor
    assert valid[1].tolist() == [
        False,
        True,
        True,
        False,
        False,
    ]  # anchored at 2, 3: the text followed; at 4 it did not
    assert valid[2].tolist() == [False, False, True, False, False]


def test_packaged_prompts_keep_the_held_out_topics_apart():
    train = {p.text for p in load_prompts(which="train")}
    held = load_prompts(which="heldout")
    assert len(train) >= 300 and {p.shape for p in held} == {"prose", "list", "chat", "code"}
    assert not train & {p.text for p in held}


# Every dense trunk the runtime runs (qwen3: the dense fixture) with every block kind, and the Gemma 3 MTP head; the
# fast tier runs each architecture and each kind once, the rest is marked slow.
DENSE_TARGETS = ("dense-target", "llama-target", "qwen2-target")
FAST_PAIRS = {("dense-target", DFLASH), ("llama-target", DSPARK), ("qwen2-target", DFLASH2)}
PARITY_CASES = [
    *(pytest.param(target, kind, "float32", marks=() if (target, kind) in FAST_PAIRS else pytest.mark.slow)
      for target in DENSE_TARGETS for kind in (DFLASH, DSPARK, DFLASH2)),
    pytest.param("gemma3-target", MTP, "bfloat16"),
]


def test_the_longest_repeat_is_the_longest_run_a_lookup_could_copy():
    text = [1, 2, 3, 4, 9, 1, 2, 3, 7, 2, 3, 4, 9, 5]
    assert longest_repeat(text, 5) == 4  # 2 3 4 9 again at positions 9-12
    assert longest_repeat(text, 13) == 0  # nothing ending at the last position occurred before
    assert longest_repeat([5, 5, 5, 5], 1) == 3  # a run may overlap itself, as a lookup copies it
    assert longest_repeat([1, 2, 3], 0) == 0


def test_a_lookup_could_copy_the_tokens_whose_window_and_token_occurred_before():
    text = [1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 5, 7, 2, 3, 4, 5, 7]
    assert copyable(text, 6, 4) == 2  # the 5 at 10 (1 2 3 4 5 again) and the 7 at 16 (2 3 4 5 7 again)
    assert copyable(text, 0, 4) == copyable(text, 6, 4)  # nothing before position 6 repeats
    assert copyable([1, 2, 3], 0, 4) == 0


@pytest.mark.slow
def test_the_nonrepeating_prompts_leave_a_lookup_little_to_copy():
    """The packaged non-repeating prose, continued greedily by the bundled Gemma as bench/select_nonrepeating.py
    measured it (128 tokens): each continuation's counts are the ones the set records, within its bound."""
    target = GGUFFile(gemma())
    tokenizer = Tokenizer.from_gguf(target)
    prompts = [json.loads(line) for line in resources.files("power.drafters").joinpath(
        "prompts", "nonrepeating.jsonl").read_text(encoding="utf-8").splitlines()]
    assert prompts and not {p["prompt"] for p in prompts} & {
        p.text for which in ("train", "heldout") for p in load_prompts(which=which)}
    engine = Engine(Workload.of_gguf(gemma()))
    for record in prompts[:2]:
        ids = tokenizer.encode(record["prompt"])
        text = ids + engine.generate(record["prompt"], 128).token_ids
        assert copyable(text, len(ids), CHAINED_NGRAM_MATCH) == record["copyable"] <= NONREPEATING_COPYABLE
        assert longest_repeat(text, len(ids)) == record["longest_repeat"]


@pytest.mark.parametrize("target, kind, precision", PARITY_CASES)
def test_distill_plan_verify_and_run_with_greedy_parity(tmp_path, target, kind, precision):
    manifest = write_manifest(tmp_path, target, [], name="fixture")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"shape": "prose", "prompt": f"Story {i}: once upon a time"}) + "\n"
                               for i in range(12)))
    out = tmp_path / "drafter"
    runner = CliRunner()
    distilled = runner.invoke(main, ["drafter", "distill", str(manifest), "--kind", kind, "--fr", "400",
                                     "--budget", "5m", "--prompts", str(prompts), "--max-new-tokens", "12",
                                     "--steps", "3", "--slots", "4", "--precision", precision, "--quiet",
                                     "-o", str(out)])
    assert distilled.exit_code == 0, distilled.output
    report = json.loads((out / "distill.json").read_text())
    assert report["settings"]["precision"] == precision
    worth = report["worth_it"]  # priced with this machine's costs: a plan is suggested only for a drafter that wins
    assert worth["k"] == report["recommended"]["k"] and worth["target_step_s"] > 0 and worth["draft_step_s"] > 0
    assert ("next: power plan" in distilled.output) == worth["beats_target_only"]
    assert ("cannot beat target-only" in distilled.output) != worth["beats_target_only"]
    assert report["steps"] == 3 and report["sequences"] == 12 and report["draft_vocab"] == 400
    # training's estimate beside the runtime's served figure, per K (the recommended K among them), with their ratio
    served, estimate = report["served"], report["acceptance"]["estimate"]
    assert served["sequences"] >= 1 and str(report["recommended"]["k"]) in served["per_k"]
    for k, figures in served["per_k"].items():
        # the estimate over the sequences the replay reached: all of them here, what acceptance.estimate covers
        assert figures["estimate"] == estimate[k] and figures["rounds"] > 0 and figures["served"] >= 1.0
        assert figures["estimate_over_served"] == pytest.approx(figures["estimate"] / figures["served"], abs=1e-3)
    assert "tokens a round, training's estimate" in distilled.output
    drafter = GGUFFile(next(out.glob("*.gguf")))
    ranked = declared_draft_tokens(header_view(drafter))
    assert ranked is not None and len(set(ranked)) == 400
    profile = (out / "profile.toml").read_text()
    gate = "spec_draft_p_min = 0.3"  # the recommended gate of a kind whose drafts it cuts (MTP, not DFlash)
    assert (gate in profile) == (kind == MTP) and report["recommended"]["k"] <= 7
    # a three-step drafter is too unsure to clear a confidence gate (the head's 0.3, DSpark's header 0.5): the parity
    # run below opens it so that the drafter proposes
    opened = "spec_draft_p_min = 0.0\n"
    (out / "profile.toml").write_text(profile.replace(gate + "\n", opened) if kind == MTP else
                                      profile.replace("spec_mtp_adaptive", opened + "spec_mtp_adaptive")
                                      if kind == DSPARK else profile)
    plan_path = tmp_path / "plan.toml"
    planned = runner.invoke(main, ["plan", str(out / "manifest.toml"), str(out / "profile.toml"), "--device", "8 GiB",
                                   "-o", str(plan_path)])
    assert planned.exit_code == 0, planned.output
    verified = runner.invoke(main, ["verify", str(plan_path)])
    assert verified.exit_code == 0, verified.output
    plan = load_plan(plan_path)
    assert plan.mode.resolved == kind and plan.speculation.fr_vocab_size is None  # the drafter's vocabulary bounds it
    assert tuple(plan.mode.chain) == (
        NGRAM,
        kind,
    )  # the manifest's lookup proposes first, the drafter where it has none
    # the lookup the held-out bench measures: the last 4 tokens, drafts of 2 or more (of 1 when K is 1)
    assert (plan.runtime.ngram_match, plan.runtime.ngram_draft_min) == (4, min(2, report["recommended"]["k"]))
    speculative = Engine(Workload.of_plan(plan, plan_path), EngineOptions(governor=False))  # every round drafts
    plain = Engine(Workload.of_gguf(fixtures()[target]))
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
    assert (a["resumed_from_step"], b["resumed_from_step"]) == (2, 0)  # trained on from the first run's 2 steps
    assert (tmp_path / "a" / "dense-target-dspark.gguf").exists()


def test_a_copied_drafter_folder_trains_on_beside_its_target_moved_elsewhere(tmp_path):
    """Training a finished drafter for longer: a copy of its folder, its target now at another path with the same
    bytes, reruns from the rows and checkpoint it holds and ends where a straight run of all the steps does."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"Line {i} of the tale" for i in range(10)) + "\n")
    moved = tmp_path / "elsewhere" / dense().name
    moved.parent.mkdir()
    shutil.copyfile(dense(), moved)
    manifests = {"here": write_manifest(tmp_path, "dense-target", [], name="fixture"),
                 "elsewhere": write_manifest(moved.parent, "dense-target", [], name="fixture", path=str(moved))}

    def distill(where: str, out: str, steps: int) -> dict:
        args = ["drafter", "distill", str(manifests[where]), "--kind", "dflash2", "--prompts", str(prompts),
                "--max-new-tokens", "8", "--slots", "2", "--quiet", "--seed", "7", "--steps", str(steps),
                "-o", str(tmp_path / out)]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        return json.loads((tmp_path / out / "distill.json").read_text())

    finished = distill("here", "first", 2)
    shutil.copytree(tmp_path / "first", tmp_path / "copy")
    continued, straight = distill("elsewhere", "copy", 4), distill("here", "straight", 4)
    assert continued["data"] == finished["data"]  # the copied rows, not the target's text generated again
    assert continued["resumed_from_step"] == 2 and straight["resumed_from_step"] == 0
    assert continued["steps"] == straight["steps"] == 4 and continued["acceptance"] == straight["acceptance"]


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


def test_training_takes_bfloat16_products_only_where_the_cpu_multiplies_them_natively():
    assert training_precision("auto", frozenset({"avx2", "avx512_bf16"})) == "bfloat16"
    assert training_precision("auto", frozenset({"avx2", "amx_bf16"})) == "bfloat16"
    assert training_precision("auto", frozenset({"avx2", "fma"})) == "float32"
    assert training_precision("float32", frozenset({"avx512_bf16"})) == "float32"  # asked for: never changed
    assert training_precision("bfloat16", frozenset()) == "bfloat16"
    with pytest.raises(ValueError, match="choose auto, float32, bfloat16"):
        training_precision("float16")


def test_the_generated_rows_are_reused_only_for_the_same_prompt_text(tmp_path):
    manifest = write_manifest(tmp_path, "dense-target", [], name="fixture")
    prompts = tmp_path / "prompts.txt"

    def distill(out: str, count: int) -> dict:
        prompts.write_text("\n".join(f"Line {i} of the tale" for i in range(count)) + "\n")
        args = ["drafter", "distill", str(manifest), "--kind", "dflash", "--prompts", str(prompts), "--max-new-tokens",
                "6", "--slots", "2", "--steps", "2", "--quiet", "-o", str(tmp_path / out)]
        assert CliRunner().invoke(main, args).exit_code == 0
        return json.loads((tmp_path / out / "distill.json").read_text())

    assert distill("out", 10)["sequences"] == 10
    assert distill("out", 20)["sequences"] == 20  # the same file, rewritten with more prompts: new rows
    distill("straight", 20)
    trained = [(tmp_path / out / "dense-target-dflash.gguf").read_bytes() for out in ("out", "straight")]
    assert trained[0] == trained[1]  # trained afresh on them, not resumed from the old rows' checkpoint


@pytest.mark.parametrize("share", [0.0, 0.5])
def test_a_corpus_shares_the_data_time_with_the_targets_own_text(tmp_path, share):
    manifest = write_manifest(tmp_path, "dense-target", [], name="fixture")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"Line {i} of the tale" for i in range(10)) + "\n")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "\n\n".join(f"Paragraph {i}: the fox ran across the quiet field into the wood." for i in range(8))
    )
    args = ["drafter", "distill", str(manifest), "--kind", "dflash", "--prompts", str(prompts), "--corpus", str(corpus),
            "--corpus-share", str(share), "--max-new-tokens", "6", "--slots", "2", "--steps", "2", "--quiet",
            "-o", str(tmp_path / "out")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "distill.json").read_text())
    data = report["data"]
    assert data["generated_sequences"] == 10  # the corpus is read in its share; generation has the rest
    assert (data["corpus_windows"] > 0) == (share > 0)  # a share of nothing reads nothing
    assert report["sequences"] == data["generated_sequences"] + data["corpus_windows"]
    assert report["tokens"] == data["generated_tokens"] + data["corpus_tokens"]


def test_acceptance_is_held_back_from_the_targets_own_text_when_there_is_any():
    def examples(count: int, first: int) -> list[Example]:
        return [Example(torch.tensor([first + i]), torch.tensor([NO_LABEL]), torch.zeros(1, 2)) for i in range(count)]

    def ids(rows: list[Example]) -> list[int]:
        return [int(e.tokens[0]) for e in rows]

    generated, corpus = examples(25, 0), examples(30, 100)
    train, held = TrainingData(generated, corpus, 1.0, 1.0).split()
    assert ids(held) == [0, 10, 20]  # every tenth sequence the target wrote; no corpus window
    assert sorted(ids(train)) == sorted(set(ids(generated + corpus)) - {0, 10, 20})
    train, held = TrainingData([], corpus, 0.0, 1.0).split()
    assert ids(held) == [100, 110, 120] and len(train) == 27


def test_the_worth_it_verdict_prices_the_held_back_acceptance_with_the_measured_costs():
    """A drafter that lands nothing cannot beat target-only whatever it costs; one that lands most drafts of a cheap
    round does; the break-even acceptance lies between."""
    costs = Costs(target_step_s=0.015, verify_cost={1: 1.1, 7: 1.6}, draft_s={1: 0.004, 7: 0.02}).document()
    nothing = judge_distilled(costs, MTP, 7, mean_accepted=0.0)
    assert not nothing.beats_target_only and nothing.speedup < 1 and nothing.p == pytest.approx(0.0)
    most = judge_distilled(costs, MTP, 7, mean_accepted=5.0)
    assert most.beats_target_only and most.speedup > 1
    assert most.break_even_p is not None and nothing.p < most.break_even_p < most.p


def test_progress_bars_run_over_the_budget_not_over_a_step_count_it_never_reaches():
    """Under a 90-second phase the train bar's total is those seconds (its ETA the budget's), not --steps 100000."""
    budgeted = BudgetBar("train", time.monotonic() + 90, 100_000, "step", enabled=False)
    assert 89 <= budgeted.bar.total <= 90
    budgeted.advance(step=1)
    assert budgeted.bar.n <= 1
    assert BudgetBar("train", None, 100_000, "step", enabled=False).bar.total == 100_000


class _Planted:
    """A pickled callable: unpickling it would create `marker` (as a pickled `os.system` would run a command)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("state", ["data.pt", "checkpoint.pt"])
def test_a_resume_file_cannot_run_code(tmp_path, state):
    manifest = write_manifest(tmp_path, "dense-target", [], name="fixture")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"Line {i} of the tale" for i in range(10)) + "\n")
    out = tmp_path / "out"
    args = ["drafter", "distill", str(manifest), "--kind", "dflash", "--prompts", str(prompts), "--max-new-tokens",
            "6", "--slots", "2", "--steps", "2", "--quiet", "-o", str(out)]
    assert CliRunner().invoke(main, args).exit_code == 0
    marker = tmp_path / "ran"
    # the planted file keeps the key file beside it: its key matches this run, so only the format protects it
    torch.save({"key": "any", "data": _Planted(marker), "net": _Planted(marker)}, out / "resume" / state)
    result = CliRunner().invoke(main, args)
    assert not marker.exists()
    assert result.exit_code == 2 and f"{out / 'resume' / state} holds more than plain tensors" in result.output
    assert f"delete {out / 'resume'} to start over" in result.output


def test_a_resume_state_another_run_made_is_never_opened(tmp_path):
    manifest = write_manifest(tmp_path, "dense-target", [], name="fixture")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"Line {i} of the tale" for i in range(10)) + "\n")
    out, marker = tmp_path / "out", tmp_path / "ran"
    resume = out / "resume"
    resume.mkdir(parents=True)
    (out / ".power-distill").write_text("")  # an earlier distill's folder, its states made for other inputs
    for state in ("data", "checkpoint"):  # keyed for other inputs: the rows and weights are made afresh
        torch.save({"key": "other", "data": _Planted(marker)}, resume / f"{state}.pt")
        (resume / f"{state}.json").write_text(json.dumps({"key": "made by another run"}))
    result = CliRunner().invoke(main, ["drafter", "distill", str(manifest), "--kind", "dflash", "--prompts",
                                       str(prompts), "--max-new-tokens", "6", "--slots", "2", "--steps", "2",
                                       "--quiet", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert not marker.exists() and json.loads((out / "distill.json").read_text())["sequences"] == 10
    assert torch.load(resume / "data.pt", weights_only=True)["generated"]  # rewritten as plain tensors


def _distill(manifest, out, *options):
    return CliRunner().invoke(main, ["drafter", "distill", str(manifest), "--kind", "dflash", "--max-new-tokens", "6",
                                     "--slots", "2", "--steps", "2", "--quiet", "-o", str(out), *map(str, options)])


def _tale(tmp_path, count=10):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"Line {i} of the tale" for i in range(count)) + "\n")
    return prompts


def test_distill_trains_only_on_the_target_the_manifest_pinned(tmp_path):
    """Issue 38 item 9: a target that is not the pinned file (here: a manifest pinning another digest) is refused
    before anything is generated or written; a manifest drafter file is held to its digest the same way."""
    swapped = write_manifest(tmp_path, "dense-target", [], name="swapped", sha256="1" * 64)
    result = _distill(swapped, tmp_path / "out", "--prompts", _tale(tmp_path))
    assert result.exit_code == 2 and "PWR115" in result.output and "target" in result.output, result.output
    assert not (tmp_path / "out").exists()
    drafted = write_manifest(tmp_path, "dense-target", [{"kind": "dflash", "fixture": "dflash-drafter",
                                                          "sha256": "2" * 64}], name="drafted")
    result = _distill(drafted, tmp_path / "out", "--prompts", _tale(tmp_path))
    assert result.exit_code == 2 and "PWR115" in result.output and "dflash drafter" in result.output, result.output


def test_distill_writes_only_into_a_folder_it_wrote(tmp_path):
    """Issue 38 item 10: -o DIR holding files distill did not write is refused and left as it was (the rule of
    render's folders); a folder an earlier distill wrote is written over (test_a_rerun_resumes_from_the_checkpoint)."""
    manifest = write_manifest(tmp_path, "dense-target", [], name="fixture")
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.toml").write_text("# the operator's own\n")
    result = _distill(manifest, out, "--prompts", _tale(tmp_path))
    assert result.exit_code == 2 and "PWR018" in result.output and "did not distill" in result.output, result.output
    assert (out / "manifest.toml").read_text() == "# the operator's own\n" and sorted(out.iterdir()) == [
        out / "manifest.toml"
    ]


@pytest.mark.parametrize("option, content, message", [
    ("--prompts", '{"prompt": "fine"}\n{"shape": "prose"}\n', "prompts.jsonl:2: a JSON line needs a \"prompt\" string"),
    ("--prompts", '{"prompt": "fine"}\n{"prompt": \n', "prompts.jsonl:2:"),
    ("--corpus", '{"text": "fine"}\n{"title": "none"}\n', "corpus.jsonl:2: a JSON line needs a \"text\""),
    ("--corpus", '{"text": "fine"}\n7\n', "corpus.jsonl:2: a JSON line must be an object"),
])
def test_a_malformed_line_is_named_by_its_file_and_number(tmp_path, option, content, message):
    """Issue 38 item 8: a JSON line without its field, or not JSON, is a usage error at the line, not a traceback."""
    manifest = write_manifest(tmp_path, "dense-target", [], name="fixture")
    given = tmp_path / ("prompts.jsonl" if option == "--prompts" else "corpus.jsonl")
    given.write_text(content)
    extra = [] if option == "--prompts" else ["--prompts", _tale(tmp_path)]
    result = _distill(manifest, tmp_path / "out", option, given, *extra)
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output, result.output


@pytest.mark.timeout(300)
@pytest.mark.parametrize("option", ["--prompts", "--corpus"])
def test_distill_reads_no_fifo_or_device(tmp_path, option):
    """Issue 38 item 8: a FIFO (which would block forever) and /dev/zero (which never ends) are refused by the
    bounded reader before anything is read."""
    manifest = write_manifest(tmp_path, "dense-target", [], name="fixture")
    fifo = tmp_path / "input.fifo"
    os.mkfifo(fifo)
    extra = [] if option == "--prompts" else ["--prompts", _tale(tmp_path)]
    for given, kind in ((fifo, "a FIFO"), (Path("/dev/zero"), "a device")):
        result = _distill(manifest, tmp_path / "out", option, given, *extra)
        assert result.exit_code == 2 and f"is {kind}, not a regular file" in result.output, result.output


def test_a_prompt_longer_than_the_context_is_cut_to_it(tmp_path):
    """Issue 38 item 8: a prompt past the target's context (2,048 for the fixture) is cut to the context beside the
    new tokens, not given a trunk as long as itself."""
    manifest = write_manifest(tmp_path, "dense-target", [], name="fixture")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(" ".join(f"w{i}" for i in range(6000)) + "\nA short tale\n")
    result = _distill(manifest, tmp_path / "out", "--prompts", prompts)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "distill.json").read_text())
    assert report["sequences"] == 2 and report["tokens"] <= 2 * 2048
