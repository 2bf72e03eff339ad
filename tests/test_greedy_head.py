"""The exact greedy LM head (`power.runtime.greedy_head`): its bound holds on every token, its
argmax is the full head's.

On the real Gemma 3 270M head (262,144 x 640, tied to the Q8_0 embedding, multiplied by `QuantMatrix` as the
runtime does) over real hidden states of a few prompts, and on a synthetic Q8_0 head built for adversarial
near-ties: rows that tie exactly or differ by the smallest step of the integer block sum on both sides of the winner.
"""

from __future__ import annotations

import pytest
import torch

from power.kernels.blocks import random_blocks
from power.runtime.gguf_weights import GGUFFile
from power.runtime.greedy_head import GreedyHead, outlier_channels
from power.runtime.layers import rms_norm
from power.runtime.linear import BOUNDED_TYPES, QuantLinear, quantised
from power.runtime.tokenizer import Tokenizer
from power.runtime.trunks import load_trunk
from tests.spec_helpers import GEMMA

PROMPTS = ("The capital of France is Paris, and the capital of Italy is Rome. The capital of Spain is",
           "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) +",
           "Once upon a time there was a little girl named Lily. She loved to play in the")
BLOCK = 32


@pytest.fixture(scope="module")
def gemma_head() -> tuple[QuantLinear, torch.Tensor]:
    """The real head as the runtime packs it (Q8_0 in its blocks) and the normed final residual of every prompt row."""
    gguf = GGUFFile(GEMMA)
    trunk = load_trunk(gguf, n_ctx=256, verify_capacity=1)
    tokenizer, layers, d = Tokenizer.from_gguf(gguf), trunk.config.n_layers, trunk.config.d_model
    finals = []
    for prompt in PROMPTS:
        trunk.reset()
        finals.append(trunk.prefill(tokenizer.encode(prompt), taps=[layers]).hidden[layers])
    normed = rms_norm(torch.cat(finals), gguf.tensor("output_norm.weight", (d,), "cpu"),
                      float(gguf.require("gemma3.attention.layer_norm_rms_epsilon")))
    head = trunk.lm_head
    assert isinstance(head, QuantLinear)
    return head, normed


def q8_0_head(levels: torch.Tensor, scales: torch.Tensor) -> QuantLinear:
    """A Q8_0 matrix from its integer weights [vocab, width] int8 and block scales [vocab, width / 32] float16."""
    vocab, width = levels.shape
    blocks = torch.cat((scales.contiguous().view(torch.uint8).view(vocab, -1, 2),
                        levels.contiguous().view(torch.uint8).view(vocab, -1, BLOCK)), dim=2)
    head = quantised(blocks.flatten().contiguous(), "Q8_0", (vocab, width), "cpu")
    assert isinstance(head, QuantLinear)
    return head


def synthetic_head(vocab: int = 4096, width: int = 160, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor,
                                                                                torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    levels = (torch.randn(vocab, width, generator=generator) * 40).round().clamp(-120, 120).to(torch.int8)
    scales = (torch.rand(vocab, width // BLOCK, generator=generator) * 1e-3 + 2e-4).to(torch.float16)
    x = torch.randn(6, width, generator=generator)
    x[:, [3, 50, 90]] *= 30  # outlier channels, as a final norm's output has
    return levels, scales, x


@pytest.mark.slow
def test_real_gemma_head_bound_holds_on_every_token_and_argmax_is_exact(gemma_head):
    head, normed = gemma_head
    calibration, rows = normed[::4], normed  # channels from a quarter of the rows; every row is checked
    greedy = GreedyHead(head, outlier_channels(calibration, 64))
    exact = head(rows)
    approx, bound = greedy.approximate(rows)
    assert bool(((exact - approx).abs() <= bound).all())
    for n in (1, 2, 8, rows.shape[0]):
        assert torch.equal(greedy.argmax(rows[:n]), exact[:n].argmax(dim=1))
    assert max(greedy.last_candidates) < head.shape[0] // 10  # it refines a part of the vocabulary, not all of it


@pytest.mark.parametrize("qtype", BOUNDED_TYPES)
def test_the_rounding_constant_covers_the_products_error_and_the_argmax_is_the_full_heads(qtype):
    vocab, width = 2048, 160
    head = quantised(random_blocks(qtype, vocab, width, seed=3).reshape(-1), qtype, (vocab, width), "cpu")
    assert isinstance(head, QuantLinear)
    x = torch.randn(6, width, generator=torch.Generator().manual_seed(4))
    x[:, [3, 50, 90]] *= 30
    effective, weights = head.effective_input(x), head.dequantised(0, vocab)
    assert torch.equal(weights[100:200], head.dequantised(100, 200))
    error = (head(x).double() - effective @ weights.t()).abs()
    assert bool((error <= head.rounding * effective.norm(dim=1)[:, None] * weights.norm(dim=1)[None, :]).all())
    greedy = GreedyHead(head, outlier_channels(x, 32))
    approx, bound = greedy.approximate(x)
    assert bool(((head(x) - approx).abs() <= bound).all())
    assert torch.equal(greedy.argmax(x), head(x).argmax(dim=1))


def tie_rows(levels: torch.Tensor, scales: torch.Tensor, x: torch.Tensor, row: int,
             above: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The head with row `row`'s winner moved to the middle and copies planted around it: two exact copies (one
    below, one above) and two one step of the integer sum below it; with `above`, the one just past it is a step
    above."""
    vocab = levels.shape[0]
    head = q8_0_head(levels, scales)
    winner, middle = int(head(x[row:row + 1]).argmax()), vocab // 2
    effective = head.effective_input(x[row:row + 1])[0]
    q = torch.cat([block / block.abs().max() * 127 for block in effective.view(-1, BLOCK)]).round()
    unit = int((q.abs() == q.abs()[q != 0].min()).nonzero()[0])  # a channel with the smallest |activation level|
    new_levels, new_scales = levels.clone(), scales.clone()
    new_levels[[winner, middle]], new_scales[[winner, middle]] = levels[[middle, winner]], scales[[middle, winner]]
    for target in (vocab // 4, 3 * vocab // 4, vocab // 3, middle + 1):
        new_levels[target], new_scales[target] = levels[winner], scales[winner]
    sign = 1 if q[unit] > 0 else -1
    for target, direction in ((vocab // 3, -1), (middle + 1, 1 if above else -1)):
        new_levels[target, unit] += direction * sign  # the block's integer sum moves by direction * |q[unit]|
    return new_levels, new_scales


@pytest.mark.parametrize("above", [False, True], ids=["exact-ties", "one-step-above"])
@pytest.mark.parametrize("row", range(6))
def test_adversarial_near_ties_resolve_as_the_full_head_does(row, above):
    levels, scales, x = synthetic_head()
    head = q8_0_head(*tie_rows(levels, scales, x, row, above))
    greedy = GreedyHead(head, outlier_channels(x, 32))
    exact = head(x)
    approx, bound = greedy.approximate(x)
    assert bool(((exact - approx).abs() <= bound).all())
    vocab = levels.shape[0]
    expected = vocab // 2 + 1 if above else vocab // 4  # the step above wins alone; else the lowest of the ties
    assert int(exact[row].argmax()) == expected
    assert torch.equal(greedy.argmax(x), exact.argmax(dim=1))
    assert int(greedy.argmax(x[row:row + 1])) == expected


def test_a_width_that_is_not_whole_int4_groups_is_refused():
    levels, scales, _ = synthetic_head(vocab=64)
    with pytest.raises(Exception, match="int4 groups"):
        GreedyHead(q8_0_head(levels, scales), [0, 1])


def test_a_head_whose_rounding_is_not_derived_is_refused():
    raw = torch.zeros(64 * 256 // 256 * 144, dtype=torch.uint8)
    head = quantised(raw, "Q4_K", (64, 256), "cpu")
    assert isinstance(head, QuantLinear)
    with pytest.raises(Exception, match="greedy head needs a Q8_0"):
        GreedyHead(head, list(range(32)))
