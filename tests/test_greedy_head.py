"""The exact greedy LM head (`power.runtime.greedy_head`): its bound holds on every token, its
argmax is the full head's.

On the real Gemma 3 270M head (262,144 x 640, tied to the Q8_0 embedding, multiplied by `QuantMatrix` as the
runtime does) over real hidden states of a few prompts and of a long greedy stream, and on a synthetic Q8_0 head
built for adversarial near-ties (rows that tie exactly or differ by the smallest step of the integer block sum on
both sides of the winner) and for activations of large norm.
"""

from __future__ import annotations

import pytest
import torch

from power.kernels.cpu.greedy import calibrated_blocks
from power.kernels.cpu.reference import quantize_rows
from power.runtime.gguf_weights import GGUFFile
from power.runtime.greedy_head import GreedyHead
from power.runtime.layers import rms_norm
from power.runtime.linear import QuantLinear, quantised
from power.runtime.tokenizer import Tokenizer
from power.runtime.trunks import load_trunk
from tests.spec_helpers import GEMMA

PROMPTS = ("The capital of France is Paris, and the capital of Italy is Rome. The capital of Spain is",
           "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) +",
           "Once upon a time there was a little girl named Lily. She loved to play in the")
BLOCK = 32
EXACT_BLOCKS = 6


def normed_rows(gguf: GGUFFile, finals: torch.Tensor) -> torch.Tensor:
    d = finals.shape[1]
    return rms_norm(finals, gguf.tensor("output_norm.weight", (d,), "cpu"),
                    float(gguf.require("gemma3.attention.layer_norm_rms_epsilon")))


@pytest.fixture(scope="module")
def gemma():
    gguf = GGUFFile(GEMMA)
    return gguf, load_trunk(gguf, n_ctx=512, verify_capacity=1, greedy_head=False), Tokenizer.from_gguf(gguf)


@pytest.fixture(scope="module")
def gemma_head(gemma) -> tuple[QuantLinear, torch.Tensor]:
    """The real head as the runtime packs it without the greedy head (Q8_0 in its blocks) and the normed final
    residual of every prompt row."""
    gguf, trunk, tokenizer = gemma
    layers = trunk.config.n_layers
    finals = []
    for prompt in PROMPTS:
        trunk.reset()
        finals.append(trunk.prefill(tokenizer.encode(prompt), taps=[layers]).hidden[layers])
    head = trunk.lm_head
    assert isinstance(head, QuantLinear)
    return head, normed_rows(gguf, torch.cat(finals))


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
    head, rows = gemma_head
    greedy = GreedyHead(head, calibrated_blocks(rows[:8], EXACT_BLOCKS))
    exact = head(rows)
    lower, upper = greedy.bounds(rows)
    assert bool(((lower <= exact) & (exact <= upper)).all())
    for n in (1, 2, 8, rows.shape[0]):
        assert torch.equal(greedy.argmax(rows[:n]), exact[:n].argmax(dim=1))
    assert max(greedy.last_candidate_tiles) < head.shape[0] // 16 // 2  # it refines a part of the tiles, not all


@pytest.mark.slow
def test_a_long_greedy_stream_takes_the_full_heads_token_at_every_step(gemma, gemma_head):
    gguf, trunk, tokenizer = gemma
    layers = trunk.config.n_layers
    greedy = GreedyHead(trunk.lm_head, calibrated_blocks(gemma_head[1], EXACT_BLOCKS))
    trunk.reset()
    out = trunk.prefill(tokenizer.encode(PROMPTS[2]), taps=[layers])
    for _ in range(200):
        normed = normed_rows(gguf, out.hidden[layers][-1:])
        token = int(out.logits[-1].argmax())
        assert int(greedy.argmax(normed)) == token
        out = trunk.forward([token], taps=[layers])


def test_the_argmax_is_the_full_heads_on_activations_of_any_norm():
    levels, scales, x = synthetic_head()
    head = q8_0_head(levels, scales)
    greedy = GreedyHead(head, calibrated_blocks(x, 2))
    for scale in (1e-3, 1.0, 1e3, 1e6):
        lower, upper = greedy.bounds(x * scale)
        exact = head(x * scale)
        assert bool(((lower <= exact) & (exact <= upper)).all())
        assert torch.equal(greedy.argmax(x * scale), exact.argmax(dim=1))


def tie_rows(levels: torch.Tensor, scales: torch.Tensor, x: torch.Tensor, row: int,
             above: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The head with row `row`'s winner moved to the middle and copies planted around it: two exact copies (one
    below, one above) and two one step of the integer sum below it; with `above`, the one just past it is a step
    above."""
    vocab = levels.shape[0]
    head = q8_0_head(levels, scales)
    winner, middle = int(head(x[row:row + 1]).argmax()), vocab // 2
    q = quantize_rows(x[row:row + 1], BLOCK)[0].flatten()  # the row's activation levels, as the products use them
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
    greedy = GreedyHead(head, calibrated_blocks(x, 2))
    exact = head(x)
    lower, upper = greedy.bounds(x)
    assert bool(((lower <= exact) & (exact <= upper)).all())
    vocab = levels.shape[0]
    expected = vocab // 2 + 1 if above else vocab // 4  # the step above wins alone; else the lowest of the ties
    assert int(exact[row].argmax()) == expected
    assert torch.equal(greedy.argmax(x), exact.argmax(dim=1))
    assert int(greedy.argmax(x[row:row + 1])) == expected


def test_a_head_that_is_not_q8_0_is_refused():
    raw = torch.zeros(64 * 256 // 256 * 144, dtype=torch.uint8)
    with pytest.raises(Exception, match="Q8_0"):
        GreedyHead(quantised(raw, "Q4_K", (64, 256), "cpu"), ())


def test_a_row_whose_pass_is_not_finite_takes_the_full_heads_argmax():
    levels, scales, x = synthetic_head()
    head = q8_0_head(levels, scales)
    greedy = GreedyHead(head, calibrated_blocks(x, 2))
    rows = x.clone()
    rows[1, 5], rows[2, 7], rows[3, 9] = float("inf"), float("nan"), float("-inf")
    assert torch.equal(greedy.argmax(rows), head(rows).argmax(dim=1))
    assert torch.equal(greedy.argmax(rows[[0, 4, 5]]), head(x[[0, 4, 5]]).argmax(dim=1))
