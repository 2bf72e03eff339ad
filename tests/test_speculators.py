"""The registry and the learned drafters, each running its real algorithm on the factory's tensors."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from spec_helpers import Calls, fixture_dir, gguf, plain_stream, prompt_for, target_path, trunk

from power.artifacts import factory
from power.documents.plan import Mode, Speculation
from power.runtime.engine import Engine, EngineOptions
from power.runtime.errors import RuntimeInputError
from power.runtime.gguf_weights import GGUFFile
from power.runtime.sampling import Sampler, SamplingParams
from power.runtime.speculators import registry
from power.runtime.speculators.base import Decline, DraftContext, SpeculatorDeclined, SpeculatorRequest
from power.runtime.speculators.dflash import grouped_conv
from power.runtime.transaction import SpeculativeSequence
from power.runtime.workload import Workload

pytestmark = pytest.mark.slow  # outside `scripts/test --fast`: interpreter-heavy or runs the real model for long

DRAFTER_FILES = {"dflash": "dflash-drafter.gguf", "dflash2": "dflash2-drafter.gguf", "dspark": "dspark-drafter.gguf"}


def _request(model: str, kind: str | None = None, fr_vocab_size: int | None = None,
             p_min: float | None = None) -> SpeculatorRequest:
    drafter = fixture_dir() / DRAFTER_FILES[kind] if kind in DRAFTER_FILES else None
    return SpeculatorRequest(trunk(model), drafter=drafter and GGUFFile(drafter), target=gguf(model),
                             fr_vocab_size=fr_vocab_size, p_min=p_min)


def _armed(model: str, kind: str, fr_vocab_size: int | None = None, p_min: float | None = None):
    """A drafter that has seen the prompt's real tapped hidden rows, as the transaction arms it."""
    speculator = registry.create(kind, _request(model, kind, fr_vocab_size, p_min))
    t = trunk(model)
    t.reset()
    prompt = prompt_for(model)
    out = t.prefill(prompt, taps=speculator.taps)
    speculator.begin(prompt)
    speculator.commit(prompt, out.hidden, 0)
    return speculator, prompt + [int(torch.argmax(out.logits[-1]))]


def test_the_registry_names_every_algorithm_and_declines_unknown_ones():
    assert set(registry.names()) == {"ngram", "mtp", "dflash", "dflash2", "dspark"}
    declined = registry.build("medusa", _request("dense"))
    assert isinstance(declined, Decline) and "known:" in declined.reason


@pytest.mark.parametrize(
    "kind, model, reason",
    [
        ("mtp", "dense", "no nextn/MTP head"),
        ("mtp", "gemma", "no nextn/MTP head"),
        ("dflash", "dense-without-drafter", "needs a dflash drafter artifact"),
        ("dflash2", "dense", "is a dflash artifact"),
    ],
)
def test_an_algorithm_that_cannot_serve_the_target_fails_closed_with_its_reason(kind, model, reason):
    if model == "dense-without-drafter":
        request = SpeculatorRequest(trunk("dense"), target=gguf("dense"))
    elif kind == "dflash2":
        request = SpeculatorRequest(trunk("dense"), drafter=GGUFFile(fixture_dir() / "dflash-drafter.gguf"),
                                    target=gguf("dense"))
    else:
        request = _request(model)
    with pytest.raises(SpeculatorDeclined, match=reason) as raised:
        registry.create(kind, request)
    assert isinstance(raised.value, RuntimeInputError)  # the CLI reports it as an input error, exit 2


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_block_drafters_propose_one_block_from_the_target_taps(kind):
    drafter, tokens = _armed("dense", kind)
    assert drafter.name == kind and drafter.taps == (1, 3)
    assert (drafter.conv, drafter.selector) == ((True, True) if kind == "dflash2" else (False, False))
    proposal = drafter.propose(DraftContext(tokens, 7))
    assert len(proposal.tokens) == drafter.hp.block_size - 1 and proposal.head_ran
    assert drafter.propose(DraftContext(tokens, 2)).tokens == proposal.tokens[:2]
    assert all(0 <= t < trunk("dense").config.vocab_size for t in proposal.tokens)


@pytest.mark.parametrize("blocks", [(), (3,)])
def test_dflash2_convolution_is_its_definition_bit_for_bit(blocks):
    """Tap t of channel c at block row r is base[t][c] + delta[r][t][c // group], multiplying x[r - t][c], summed
    over t in order and zero before the block: the runtime's rows and training's blocks side by side alike."""
    generator = torch.Generator().manual_seed(3)
    rows, kernel, channels, group = 6, 4, 32, 8
    x = torch.randn(*blocks, rows, channels, generator=generator)
    base = torch.randn(kernel, channels, generator=generator)
    delta = torch.randn(*blocks, rows, kernel, channels // group, generator=generator)
    expected = torch.zeros_like(x)
    for r in range(rows):
        for t in range(min(kernel, r + 1)):
            for c in range(channels):
                tap = base[t, c] + delta[..., r, t, c // group]
                expected[..., r, c] += tap * x[..., r - t, c]
    assert torch.equal(grouped_conv(x, base, delta, group), expected)


def test_dflash2_selector_walk_conditions_each_position_on_its_predecessor():
    drafter, tokens = _armed("dense", "dflash2")
    rows = drafter._block(tokens[-1])[1:]
    candidates = drafter._unary(drafter.head.draft_logits(rows)).topk(drafter.hp.selector_top_k, dim=-1).indices
    walked = drafter._selector_walk(tokens[-1], rows)
    assert all(t in candidates[e].tolist() for e, t in enumerate(walked))  # every pick is a top-k candidate
    # Random fixture codebooks are too small to outvote the unary term; scaled up, the predecessor decides.
    for book in ("selector_predecessor.weight", "selector_successor.weight"):
        drafter.w[book] = drafter.w[book] * 300
    first_picks = {drafter._selector_walk(anchor, rows)[0] for anchor in range(0, drafter.hp.vocab_size, 7)}
    assert len(first_picks) > 1 and first_picks <= set(candidates[0].tolist())


def test_dspark_cuts_the_block_at_the_first_low_confidence_position():
    everything, tokens = _armed("dense", "dspark", p_min=0.0)
    nothing, _ = _armed("dense", "dspark", p_min=1.0)
    full = everything.propose(DraftContext(tokens, 7))
    gated = nothing.propose(DraftContext(tokens, 7))
    assert len(full.tokens) == everything.hp.block_size - 1
    assert gated.tokens == [] and gated.head_ran  # the head ran: the governor counts a speculative step


def test_mtp_chains_the_nextn_head_from_the_last_committed_hidden_row():
    head, tokens = _armed("hybrid", "mtp")
    assert head.taps == (trunk("hybrid").config.n_layers,)
    proposal = head.propose(DraftContext(tokens, 5))
    assert len(proposal.tokens) == 5 and proposal.head_ran
    checkpoint = head.checkpoint()
    again = head.propose(DraftContext(tokens, 5))
    assert again.tokens == proposal.tokens  # drafting leaves the committed state alone
    head.restore(checkpoint)
    assert head.length == len(tokens) - 1


def test_mtp_queues_committed_rows_and_drafts_as_if_it_had_taken_each_round_at_once():
    """Rows committed round by round are queued and run in one pass when the head next proposes; a round rolled back
    after that pass queues them again. The drafts are the ones of a head that took the whole prompt at once."""
    whole, tokens = _armed("hybrid", "mtp")
    t = trunk("hybrid")
    t.reset()
    prompt = tokens[:-1]
    hidden = t.prefill(prompt, taps=whole.taps).hidden[whole.taps[0]]
    rounds = registry.create("mtp", _request("hybrid"))
    rounds.begin(prompt)
    for start in range(0, len(prompt), 3):
        rounds.commit(prompt[start : start + 3], {whole.taps[0]: hidden[start : start + 3]}, start)
        if start == 3:  # a round that proposes (its pass runs the queue) and is then rolled back
            checkpoint = rounds.checkpoint()
            rounds.propose(DraftContext(prompt[: start + 4], 2))
            rounds.restore(checkpoint)
    assert rounds.queued  # nothing ran the last rounds' rows yet
    assert rounds.propose(DraftContext(tokens, 5)).tokens == whole.propose(DraftContext(tokens, 5)).tokens
    assert not rounds.queued


def test_a_head_that_sat_out_rounds_is_told_them_at_once_and_drafts_as_if_told_each():
    """Rounds in which nothing is proposed never call the speculator; the round it next proposes in hands it every row
    it missed in one commit, before its proposal, and its drafts are those of a head that took the whole text at once.
    A round rolled back after that commit hands the rows again; the stream is the plain one throughout."""
    t = trunk("hybrid")
    t.reset()
    head = Calls(registry.create("mtp", _request("hybrid")))
    seq = SpeculativeSequence(t, Sampler(SamplingParams()), head)
    prompt = prompt_for("hybrid")
    seq.start(prompt)
    head.calls.clear()
    for _ in range(12):
        seq.round(0)
    assert head.calls == []  # twelve plain rounds: the target-only round, nothing else
    rolled_back = seq.open_round(5)
    seq.abort_round(rolled_back)
    assert head.calls == ["checkpoint", ("commit", 0, len(prompt) + 12), "propose", "restore"]
    head.calls.clear()
    opened = seq.open_round(5)
    assert head.calls == ["checkpoint", ("commit", 0, len(prompt) + 12), "propose"]
    assert len(opened.drafts) == 5
    seq.close_round(opened, t.forward(opened.rows, taps=head.taps))
    assert seq.emitted == list(plain_stream("hybrid", len(seq.emitted)))
    t.reset()
    whole = registry.create("mtp", _request("hybrid"))
    committed = seq.tokens[: len(prompt) + 12]
    whole.begin(committed)
    whole.commit(committed, t.prefill(committed, taps=whole.taps).hidden, 0)
    assert opened.drafts == whole.propose(DraftContext(seq.tokens[: len(committed) + 1], 5)).tokens


def test_mtp_cuts_its_drafts_at_the_first_draft_below_the_confidence_gate():
    """llama.cpp's draft-mtp: drafting stops at the first draft whose probability is below spec_draft_p_min."""
    ungated, tokens = _armed("hybrid", "mtp")
    full = ungated.propose(DraftContext(tokens, 5)).tokens
    assert _armed("hybrid", "mtp", p_min=0.0)[0].propose(DraftContext(tokens, 5)).tokens == full
    closed = _armed("hybrid", "mtp", p_min=1.0)[0].propose(DraftContext(tokens, 5))
    assert closed.tokens == [] and closed.head_ran  # the head ran: the governor counts a speculative step
    probabilities = _draft_probabilities(ungated, tokens, 5)
    assert [token for token, _ in probabilities] == full
    for p_min in sorted(p for _, p in probabilities):  # each draft's own probability as the gate: it passes
        kept = next((i for i, (_, p) in enumerate(probabilities) if p < p_min), len(probabilities))
        assert _armed("hybrid", "mtp", p_min=p_min)[0].propose(DraftContext(tokens, 5)).tokens == full[:kept]


def _draft_probabilities(head, tokens, n):
    """Each draft of an ungated chain with its probability under the head's softmax, from the head's own parts."""
    from power.runtime.layers import rms_norm

    out, token, h = [], tokens[-1], head.last_hidden
    for position in range(head.length, head.length + n):
        y = head._step([token], h[None], position)
        [token], [probability] = head.head.draft_top(rms_norm(y, head.head_norm, head.block.eps))
        out.append((token, probability))
        h = y[0]
    return out


def test_an_mtp_sidecar_drafts_what_the_targets_own_head_drafts(tmp_path):
    """The hybrid target without its head + the MTP-only GGUF of the same model = the hybrid target's own head."""
    native, tokens = _armed("hybrid", "mtp")
    sidecar = factory.build_mtp_sidecar(tmp_path)
    headless = factory.build_headless_hybrid_target(tmp_path)
    request = SpeculatorRequest(trunk("hybrid"), target=GGUFFile(headless), drafter=GGUFFile(sidecar))
    attached = registry.create("mtp", request)
    attached.begin(tokens[:-1])
    t = trunk("hybrid")
    t.reset()
    out = t.prefill(tokens[:-1], taps=attached.taps)
    attached.commit(tokens[:-1], out.hidden, 0)
    assert attached.propose(DraftContext(tokens, 5)).tokens == native.propose(DraftContext(tokens, 5)).tokens
    declined = registry.build("mtp", SpeculatorRequest(trunk("hybrid"), target=GGUFFile(headless)))
    assert isinstance(declined, Decline) and "carries no nextn/MTP head" in declined.reason


def test_fr_cuts_only_the_draft_head_projection():
    drafter, tokens = _armed("dense", "dflash", fr_vocab_size=64)
    assert all(t < 64 for t in drafter.propose(DraftContext(tokens, 7)).tokens)
    with pytest.raises(ValueError, match="spec_mtp_fr_vocab_size"):
        registry.create("dflash", _request("dense", "dflash", fr_vocab_size=10**6))


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_a_block_drafter_queues_committed_rows_and_a_rolled_back_catch_up_leaves_no_trace(kind):
    """Rows committed round by round are queued (a round the drafter does not propose on runs none of its passes),
    the rows its window would evict are dropped unrun, and a round rolled back after its catch-up evicted window rows
    is taken again: the ring and the drafts are those of a drafter that took the whole text at once."""
    t = trunk("dense")
    text = prompt_for("dense") + list(plain_stream("dense", 60))
    t.reset()
    hidden = t.prefill(text[:-1], taps=(1, 3)).hidden
    whole = registry.create(kind, _request("dense", kind))
    whole.begin(text[:-1])
    whole.commit(text[:-1], hidden, 0)
    rounds = registry.create(kind, _request("dense", kind))
    rounds.begin(text[:-1])
    window = rounds.ring.rows
    for start in range(0, len(text) - 1, 3):
        piece = text[start : min(start + 3, len(text) - 1)]
        rounds.commit(piece, {layer: rows[start : start + len(piece)] for layer, rows in hidden.items()}, start)
        if start == 45:  # past the window: the catch-up writes over rows the window still shows, then rolls back
            checkpoint = rounds.checkpoint()
            rounds.propose(DraftContext(text[: start + 4], 2))
            rounds.restore(checkpoint)
    assert rounds.ring.length < len(text) - 1 - 3  # the last rounds' rows are queued, not run
    assert sum(len(queued.features) for queued in rounds.queued) < window + 3  # evicted rows were dropped unrun
    assert rounds.propose(DraftContext(text, 7)).tokens == whole.propose(DraftContext(text, 7)).tokens
    assert not rounds.queued and rounds.ring.extent[1] == whole.ring.extent[1] == len(text) - 1
    for layer in range(rounds.hp.block_count):
        assert torch.allclose(rounds.ring.window(layer)[0], whole.ring.window(layer)[0], atol=1e-5)


def _engine(mode: str, governor: bool = True) -> Engine:
    """The dense fixture at K = S = 7 in `mode`, without a plan (n-gram match length 2)."""
    plain = Workload.of_gguf(target_path("dense"), ctx=512, verify_capacity=8)
    workload = replace(plain, mode=Mode(requested=mode, resolved=mode, chain=(mode,) if mode != "none" else (),
                                        reason="test"),
                       speculation=Speculation(k=7, s=7, rollback="full"),
                       runtime=plain.runtime.model_copy(update={"ngram_match": 2, "ngram_draft_min": 1,
                                                                "ngram_draft_max": 7}))
    return Engine(workload, EngineOptions(governor=governor))


def test_the_engine_speculates_with_the_plan_mode_and_emits_the_plain_stream():
    plain = _engine("none").generate("Hello world! Hello there, how are you today? Hello world! Hello", 48)
    spec = _engine("ngram", governor=False).generate("Hello world! Hello there, how are you today? Hello world! Hello",
                                                     48)
    assert spec.token_ids == plain.token_ids
    assert spec.proposed > 0 and plain.proposed == 0


def test_the_engine_fails_closed_when_the_mode_cannot_serve_the_target():
    with pytest.raises(SpeculatorDeclined, match="nextn"):
        _engine("mtp")


def _chain_plan(directory, with_ngram: bool):
    """The dense fixture with its DSpark drafter (and the weight-free n-gram in front of it when `with_ngram`)."""
    import hashlib

    from click.testing import CliRunner

    from power.app.cli import main

    def sha(path):
        return hashlib.sha256(path.read_bytes()).hexdigest()

    target, drafter = factory.build_dense_target(directory), factory.build_dspark_drafter(directory)
    ngram = '[[drafters]]\nkind = "ngram"\n' if with_ngram else ""
    (directory / "manifest.toml").write_text(
        f'schema = "power.manifest/v1"\nname = "dense"\n[target]\npath = "{target.name}"\nsha256 = "{sha(target)}"\n'
        f'{ngram}[[drafters]]\nkind = "dspark"\npath = "{drafter.name}"\nsha256 = "{sha(drafter)}"\n'
        f'target_sha256 = "{sha(target)}"\n')
    (directory / "profile.toml").write_text(
        'schema = "power.profile/v1"\nname = "dspark"\nspec_mode = "dspark"\nspec_draft_max = 3\n'
        'spec_mtp_recurrent_snapshots = 3\n[runtime]\nctx = 256\nngram_match = 2\n')
    plan = directory / "plan.json"
    planned = CliRunner().invoke(main, ["plan", str(directory / "manifest.toml"), str(directory / "profile.toml"),
                                        "--device", "1 GiB", "-o", str(plan)])
    assert planned.exit_code == 0, planned.output
    from power.documents.plan import load_plan

    resolved = load_plan(plan)
    engine = Engine(Workload.of_plan(resolved, plan), EngineOptions(threads=1, governor=False))
    receipt = engine.generate("a b c d e f a b c d e f a b c d e f a b c", 48)
    return list(resolved.mode.chain), receipt


def test_a_chain_of_ngram_and_dspark_runs_both_in_order(tmp_path):
    """Issue 23 defect 6: the plan's chain `ngram -> dspark` runs the chain (the lookup proposes on a repetitive
    prompt where DSpark alone, gated by its confidence, proposes less), never DSpark alone; greedy output is the
    target's either way."""
    (tmp_path / "alone").mkdir()
    (tmp_path / "chain").mkdir()
    alone_chain, alone = _chain_plan(tmp_path / "alone", with_ngram=False)
    chain, chained = _chain_plan(tmp_path / "chain", with_ngram=True)
    assert alone_chain == ["dspark"] and chain == ["ngram", "dspark"]
    assert chained.token_ids == alone.token_ids
    assert chained.proposed > alone.proposed
