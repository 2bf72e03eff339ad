"""The trunk contract on every trunk: per-row bit identity, rewind, checkpoints, recurrent snapshots.

A row's logits must be bit-identical whether its token ran alone (one real row;
padded to the verification capacity in the float32 reference) or as row j of a
forward of any row count after the same prefix, and again after a rewind and
re-forward. That is what makes a greedy speculative stream equal to the
autoregressive one.
"""

from __future__ import annotations

import functools

import pytest
import torch
from gguf_helpers import assert_rows_match_alone, fixtures, gemma

from power.documents.arithmetic import ARITHMETICS, FLOAT32, QUANTISED
from power.documents.kv_types import F32, Q8_0, RUNTIME_KV_TYPES
from power.runtime.errors import ContextOverflow
from power.runtime.trunks import load_trunk
from power.runtime.trunks.base import Part
from power.runtime.trunks.protocol import OutsideResidentWindow

pytestmark = pytest.mark.slow  # outside `scripts/test --fast`: interpreter-heavy or runs the real model for long

PREFIX = [2, 818, 5279, 529, 7001]  # "<bos>The capital of France" in Gemma's vocabulary; plain ids for the fixtures
ROWS = [563, 9079, 236761, 1030]  # " is", " Paris", ".", " The"
CAPACITY = 4
S = 2


@functools.cache
def trunk(name: str, arithmetic: str = QUANTISED):
    path = gemma() if name == "gemma" else fixtures()[name]
    return load_trunk(path, n_ctx=64, verify_capacity=CAPACITY, snapshot_rows=S, arithmetic=arithmetic)


def tokens_for(name: str) -> tuple[list[int], list[int]]:
    if name == "gemma":
        return PREFIX, ROWS
    vocab = trunk(name).config.vocab_size
    return [t % vocab for t in PREFIX], [t % vocab for t in ROWS]


TRUNKS = [(name, arithmetic) for name in ("gemma", "dense-target", "hybrid-target") for arithmetic in ARITHMETICS]
# Every KV type on every trunk whose head rows it stores (q8_0 needs whole blocks of 32: the fixtures' heads are 16
# wide, gemma3-target's 32, the real Gemma's 256).
KV_TRUNKS = [(name, kv_type) for name in ("gemma", "gemma3-target", "dense-target", "hybrid-target")
             for kv_type in RUNTIME_KV_TYPES if kv_type != Q8_0 or name.startswith("gemma")]


def path_of(name: str):
    return gemma() if name == "gemma" else fixtures()[name]


def test_the_quantised_arithmetic_runs_real_rows_on_the_cpu_and_the_reference_pads():
    assert trunk("gemma", QUANTISED).real_rows and trunk("hybrid-target", QUANTISED).real_rows
    assert not trunk("gemma", FLOAT32).real_rows


@pytest.mark.parametrize("name,arithmetic", TRUNKS)
def test_a_row_is_bit_identical_alone_among_others_and_after_rewind(name, arithmetic):
    model = trunk(name, arithmetic)
    prefix, rows = tokens_for(name)
    taps = (1, model.config.n_layers)
    model.reset()
    model.prefill(prefix)
    start = model.checkpoint()
    together = model.forward(rows, taps=taps)
    model.restore(start)
    for j, token in enumerate(rows):  # row j alone, after the same prefix + rows[:j]
        alone = model.forward([token], taps=taps)
        assert torch.equal(alone.logits[0], together.logits[j]), f"row {j} differs from its one-row forward"
        for layer in taps:
            assert torch.equal(alone.hidden[layer][0], together.hidden[layer][j])
    model.restore(start)
    model.forward(rows)
    model.rewind(start[0] + len(rows) - 1)
    again = model.forward(rows[-1:])
    assert torch.equal(again.logits[0], together.logits[-1]), "re-forward after rewind differs"


@pytest.mark.parametrize("name,kv_type", KV_TRUNKS)
def test_a_row_is_the_same_bits_at_every_row_count(name, kv_type):
    """The quantised arithmetic runs a forward on its real rows: row j of a forward of n rows, for every n from 1 to
    the capacity, equals the same token forwarded alone after the same prefix (logits and taps), and so does every
    row of a prefill chunk of any length; with every KV type (each cache row rounded by itself as it is written)."""
    model = load_trunk(path_of(name), n_ctx=64, verify_capacity=8, snapshot_rows=8, kv_type=kv_type)
    assert model.real_rows
    vocab = model.config.vocab_size
    prefix = [t % vocab for t in PREFIX]
    rows = [(104729 * i) % (vocab - 10) + 10 for i in range(8)]
    taps = (1, model.config.n_layers)
    model.reset()
    model.prefill(prefix)
    assert_rows_match_alone(model, rows, taps)
    model.reset()
    whole = model.prefill([*prefix, *rows], all_logits=True)
    for n in range(1, len(prefix) + len(rows)):
        model.reset()
        pieces = [model.prefill([*prefix, *rows][:n], all_logits=True),
                  model.prefill([*prefix, *rows][n:], all_logits=True)]
        assert torch.equal(torch.cat([p.logits for p in pieces]), whole.logits), f"a prefill split at {n} differs"


@pytest.mark.parametrize("name,arithmetic,kv_type", [(name, arithmetic, F32) for name, arithmetic in TRUNKS]
                         + [(name, QUANTISED, kv_type) for name, kv_type in KV_TRUNKS if kv_type != F32])
def test_rows_of_several_sequences_in_one_forward_equal_each_sequence_alone(name, arithmetic, kv_type):
    """Three sequences of different lengths share one forward (and one prefill chunk): every row, logits and taps,
    equals the same rows forwarded in their own slot alone - whatever row offset their segment had; with every KV
    type."""
    model = load_trunk(path_of(name), n_ctx=64, verify_capacity=CAPACITY, snapshot_rows=S, arithmetic=arithmetic,
                       slots=3, kv_type=kv_type)
    prefix, rows = tokens_for(name)
    taps = (1, model.config.n_layers)
    prompts = [prefix, prefix[:2], [*prefix, *rows]]
    for slot in range(3):
        model.reset(slot)
    prefilled = model.prefill_parts([Part(slot, p) for slot, p in enumerate(prompts)], taps)
    parts = [Part(0, rows[:1]), Part(1, rows[1:3]), Part(2, rows[3:])]
    before = [model.checkpoint(slot) for slot in range(3)]
    together = model.forward_parts(parts, taps)
    for slot, part in enumerate(parts):
        model.reset(slot)
        alone_prefill = model.prefill(prompts[slot], taps, all_logits=True, slot=slot)
        assert torch.equal(alone_prefill.logits, prefilled[slot].logits)
        assert model.checkpoint(slot)[0] == before[slot][0]
        alone = model.forward(part.tokens, taps, slot=slot)
        assert torch.equal(alone.logits, together[slot].logits), f"slot {slot}'s rows differ from their lone forward"
        for layer in taps:
            assert torch.equal(alone.hidden[layer], together[slot].hidden[layer])


# Forwards of 8 rows from these positions cross slots 64, 256 and 768, deep in the context, where a local Gemma
# layer (window 512) stops reading the first slots of its window as the rows advance.
CROSSINGS = (60, 252, 764)


@pytest.mark.parametrize("name,arithmetic", [("gemma", QUANTISED), ("dense-target", FLOAT32),
                                             ("hybrid-target", QUANTISED)])
def test_rows_stay_bit_identical_deep_in_the_context_and_the_sliding_window(name, arithmetic):
    """Each row reads only the slots up to its position (and in its window): a row among others (which read more
    slots, before and after its own) must still match it alone, deep in a long context."""
    path = gemma() if name == "gemma" else fixtures()[name]
    model = load_trunk(path, n_ctx=1024, verify_capacity=8, arithmetic=arithmetic)
    vocab = model.config.vocab_size
    prefix = [2] + [(7919 * i) % (vocab - 10) + 10 for i in range(1, max(CROSSINGS))]
    rows = [(104729 * i) % (vocab - 10) + 10 for i in range(8)]
    for start in CROSSINGS:
        model.reset()
        model.prefill(prefix[:start])
        before = model.checkpoint()
        together = model.forward(rows, taps=(1,))
        model.restore(before)
        for j, token in enumerate(rows):
            alone = model.forward([token], taps=(1,))
            assert torch.equal(alone.logits[0], together.logits[j]), f"position {start + j} differs alone"
            assert torch.equal(alone.hidden[1][0], together.hidden[1][j])


@pytest.mark.parametrize("name", ["dense-target", "hybrid-target"])
def test_prefill_keeps_every_row_or_only_the_last_with_the_same_values(name):
    model = trunk(name)
    prefix, rows = tokens_for(name)
    model.reset()
    whole = model.prefill(prefix + rows, taps=(0,), all_logits=True)
    assert whole.logits.shape == (len(prefix) + len(rows), model.config.vocab_size)
    assert whole.hidden[0].shape == (len(prefix) + len(rows), model.config.d_model)
    model.reset()
    last_only = model.prefill(prefix + rows)
    assert torch.equal(last_only.logits[0], whole.logits[-1])
    assert model.position == len(prefix) + len(rows)


def test_attention_trunks_rewind_anywhere_and_checkpoints_restore():
    model = trunk("dense-target")
    prefix, rows = tokens_for("dense-target")
    model.reset()
    model.prefill(prefix)
    first = model.forward(rows[:1]).logits[0]
    model.forward(rows[1:])
    model.rewind(len(prefix))
    assert torch.equal(model.forward(rows[:1]).logits[0], first)
    with pytest.raises(ValueError, match="outside the committed range"):
        model.rewind(model.position + 1)


def test_hybrid_snapshots_cover_exactly_the_last_s_rows():
    model = trunk("hybrid-target")
    prefix, rows = tokens_for("hybrid-target")
    model.reset()
    model.prefill(prefix)
    start = model.position
    out = model.forward(rows)  # 4 rows, S = 2: lengths start+2 .. start+4 are resident
    end = start + len(rows)
    model.rewind(end - S)
    assert torch.equal(model.forward(rows[S:S + 1]).logits[0], out.logits[S])
    model.rewind(end - S)  # the state at that length is resident again after a 1-row forward
    with pytest.raises(OutsideResidentWindow, match=f"length {end - S - 1} is outside the resident window"):
        model.rewind(end - S - 1)


def test_hybrid_replay_from_a_checkpoint_reproduces_the_rows():
    model = trunk("hybrid-target")
    prefix, rows = tokens_for("hybrid-target")
    model.reset()
    model.prefill(prefix)
    checkpoint = model.checkpoint()
    out = model.forward(rows)
    with pytest.raises(OutsideResidentWindow):
        model.rewind(checkpoint[0] + 1)
    model.restore(checkpoint)
    replay = model.forward(rows[:1])
    assert torch.equal(replay.logits[0], out.logits[0])
    assert torch.equal(model.forward(rows[1:2]).logits[0], out.logits[1])


def test_the_recurrent_state_is_real_state():
    """Different histories of the same length give different next-row logits only through the
    recurrent layers' state."""
    model = trunk("hybrid-target")
    prefix, rows = tokens_for("hybrid-target")
    model.reset()
    model.prefill(prefix)
    a = model.forward(rows[:1]).logits[0]
    model.reset()
    model.prefill(prefix[::-1])
    b = model.forward(rows[:1]).logits[0]
    assert not torch.equal(a, b)


def test_a_forward_past_the_context_is_refused_with_the_limit():
    model = trunk("dense-target")
    model.reset()
    model.prefill([1] * 62)
    with pytest.raises(ContextOverflow, match="65 positions do not fit the context of 64"):
        model.forward([1, 2, 3])
    assert model.position == 62
    with pytest.raises(ValueError, match="1..4 rows"):
        model.forward([1] * 5)


@pytest.mark.parametrize("arithmetic", ARITHMETICS)
@pytest.mark.parametrize("name", ["dense-target", "hybrid-target", "gemma"])
def test_every_tensor_a_trunk_makes_lives_on_its_device(name, arithmetic):
    """On the meta device every op checks placement without computing: a tensor left on the CPU would raise here.
    Off the CPU a trunk takes the GPU path: the quantised matrices are their GGUF rows there (the GPU's product), and
    since that product, the attention and the norms are row-count invariant, a quantised trunk runs real rows."""
    path = gemma() if name == "gemma" else fixtures()[name]
    model = load_trunk(path, n_ctx=32, verify_capacity=CAPACITY, snapshot_rows=S, arithmetic=arithmetic, device="meta")
    assert model.options.kernels and model.real_rows == (arithmetic == QUANTISED)
    prefix, rows = tokens_for(name)
    model.prefill(prefix, taps=(1,))
    start = model.checkpoint()
    out = model.forward(rows[:3], taps=(1,))
    model.rewind(model.position - 1)
    model.restore(start)
    assert out.logits.device.type == out.hidden[1].device.type == "meta"
    assert out.logits.shape == (3, model.config.vocab_size)

