"""The exact greedy LM head (`power.runtime.greedy_head`): its bound holds on every token, its argmax is the full head's.

On the real Gemma 3 270M head (262,144 x 640, tied to the Q8_0 embedding, int8 at one activation level) over real
hidden states of a few prompts, and on a synthetic head built for adversarial near-ties: rows that tie exactly or
differ by one unit of the integer sum (about one float32 ulp of the score) on both sides of the winner.
"""

from __future__ import annotations

import pytest
import torch

from power.runtime.gguf_weights import GGUFFile
from power.runtime.greedy_head import GreedyHead, outlier_channels
from power.runtime.layers import rms_norm
from power.runtime.linear import Int8Linear, pack_head
from power.runtime.tokenizer import Tokenizer
from power.runtime.trunks import load_trunk
from tests.spec_helpers import GEMMA

PROMPTS = ("The capital of France is Paris, and the capital of Italy is Rome. The capital of Spain is",
           "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) +",
           "Once upon a time there was a little girl named Lily. She loved to play in the")


@pytest.fixture(scope="module")
def gemma_head() -> tuple[Int8Linear, torch.Tensor]:
    """The real head as the runtime packs it (int8, one level) and the normed final residual of every prompt row."""
    gguf = GGUFFile(GEMMA)
    trunk = load_trunk(gguf, n_ctx=256, verify_capacity=1, dtype="bfloat16", lm_head_dtype="int8")
    tokenizer, layers = Tokenizer.from_gguf(gguf), trunk.config.n_layers
    finals = []
    for prompt in PROMPTS:
        trunk.reset()
        finals.append(trunk.prefill(tokenizer.encode(prompt), taps=[layers]).hidden[layers])
    d = trunk.config.d_model
    normed = rms_norm(torch.cat(finals), gguf.tensor("output_norm.weight", (d,), "cpu"),
                      float(gguf.require("gemma3.attention.layer_norm_rms_epsilon")))
    head = pack_head(gguf.tensor("token_embd.weight", (trunk.config.vocab_size, d), "cpu"), "int8", 1)
    assert isinstance(head, Int8Linear)
    return head, normed


def test_select_is_the_full_products_columns_bit_for_bit():
    head = pack_head(torch.randn(1000, 96, generator=torch.Generator().manual_seed(0)), "int8", 1)
    assert isinstance(head, Int8Linear)
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(1)) * 3
    rows = torch.tensor([0, 3, 17, 500, 998, 999])
    for n in (1, 2, 5):
        assert torch.equal(head.select(x[:n], rows), head(x[:n])[:, rows])


@pytest.mark.slow
def test_real_gemma_head_bound_holds_on_every_token_and_argmax_is_exact(gemma_head):
    head, normed = gemma_head
    calibration, rows = normed[::4], normed  # channels from a quarter of the rows; every row is checked
    greedy = GreedyHead(head, outlier_channels(calibration, 64))
    exact = head(rows)
    assert torch.equal(head.select(rows[:8], torch.arange(head.shape[0])), exact[:8])  # select's bits, whole head
    approx, bound = greedy.approximate(rows)
    assert bool(((exact - approx).abs() <= bound).all())
    for n in (1, 2, 8, rows.shape[0]):
        assert torch.equal(greedy.argmax(rows[:n]), exact[:n].argmax(dim=1))
    assert max(greedy.last_candidates) < head.shape[0]  # it refines a part of the vocabulary, not all of it


def synthetic_head(vocab: int = 4096, width: int = 160, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, width, generator=generator) * 0.05
    x = torch.randn(6, width, generator=generator)
    x[:, [3, 50, 90]] *= 30  # outlier channels, as a final norm's output has
    return weight, x


def tie_rows(weight: torch.Tensor, x: torch.Tensor, head: Int8Linear, row: int, above: bool) -> torch.Tensor:
    """`weight` with row `row`'s winner moved to the middle and copies planted around it: two exact copies (one
    below, one above) and two one integer unit below it; with `above`, the one just past it is a unit above."""
    vocab = weight.shape[0]
    winner, middle = int(head(x[row:row + 1]).argmax()), vocab // 2
    levels = torch.round(head.effective_input(x[row:row + 1])[0] / head.effective_input(x[row:row + 1]).abs().max() * 127)
    unit = int((levels.abs() == levels.abs()[levels != 0].min()).nonzero()[0])  # a channel with the smallest |level|
    planted = weight.clone()
    planted[[winner, middle]] = weight[[middle, winner]]
    scale = weight[winner].abs().max() / 127
    for target in (vocab // 4, 3 * vocab // 4, vocab // 3, middle + 1):
        planted[target] = weight[winner]
    sign = 1.0 if levels[unit] > 0 else -1.0
    for target, direction in ((vocab // 3, -1.0), (middle + 1, 1.0 if above else -1.0)):
        level = torch.round(planted[target, unit] / scale) + direction * sign  # the integer sum moves by direction
        assert abs(level) < 127  # the row's scale stays its copy's
        planted[target, unit] = level * scale
    return planted


@pytest.mark.parametrize("above", [False, True], ids=["exact-ties", "one-unit-above"])
@pytest.mark.parametrize("row", range(6))
def test_adversarial_near_ties_resolve_as_the_full_head_does(row, above):
    weight, x = synthetic_head()
    base = pack_head(weight, "int8", 1)
    assert isinstance(base, Int8Linear)
    head = pack_head(tie_rows(weight, x, base, row, above), "int8", 1)
    assert isinstance(head, Int8Linear)
    greedy = GreedyHead(head, outlier_channels(x, 32))
    exact = head(x)
    approx, bound = greedy.approximate(x)
    assert bool(((exact - approx).abs() <= bound).all())
    vocab = weight.shape[0]
    expected = vocab // 2 + 1 if above else vocab // 4  # the unit above wins alone; else the lowest of the ties
    assert int(exact[row].argmax()) == expected
    assert torch.equal(greedy.argmax(x), exact.argmax(dim=1))
    assert int(greedy.argmax(x[row:row + 1])) == expected


def test_a_width_that_is_not_whole_int4_groups_is_refused():
    head = pack_head(torch.randn(64, 100), "int8", 1)
    assert isinstance(head, Int8Linear)
    with pytest.raises(Exception, match="int4 groups"):
        GreedyHead(head, [0, 1])
