"""The greedy head's cheap pass (power.kernels.cpu.greedy): every instruction path computes its torch reference's bits,
its bound holds through the float32 comparisons, with every block exact it is the Q8_0 product itself, and the
calibrated exact blocks are where the activation is; the whole head in one call (`CompactHead.argmax`) is the
reference product's argmax on every path, ties to the lowest token, and gives up (-1) where the pass is not finite.
The head held once this way is the Q8_0 head: its product and its rows are the Q8_0 matrix's bits on every path."""

from __future__ import annotations

import pytest
import torch

from power.kernels.blocks import random_blocks
from power.kernels.cpu import QuantMatrix, available_paths
from power.kernels.cpu.greedy import CompactHead, calibrated_blocks, reference_bounded
from power.kernels.cpu.reference import matmul

PATHS = available_paths()
VOCAB, WIDTH = 200, 160  # 13 tiles, the last one padded; 5 blocks a row


def head(seed: int = 1) -> tuple[torch.Tensor, QuantMatrix]:
    raw = random_blocks("Q8_0", VOCAB, WIDTH, seed=seed).reshape(-1)
    return raw, QuantMatrix("Q8_0", raw, (VOCAB, WIDTH))


def rows(n: int, seed: int = 2, scale: float = 1.0) -> torch.Tensor:
    x = torch.randn(n, WIDTH, generator=torch.Generator().manual_seed(seed)) * scale
    x[:, [3, 50, 90]] *= 30  # outlier channels, as a final norm's output has
    return x


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("exact_blocks", [(), (1, 3), (0, 1, 2, 3, 4)])
def test_every_path_is_its_reference_bit_for_bit(path: str, n: int, exact_blocks: tuple[int, ...]) -> None:
    raw, matrix = head()
    x = rows(n)
    p, bound = CompactHead(matrix, exact_blocks).bounded(x, path)
    want_p, want_bound = reference_bounded(raw, (VOCAB, WIDTH), x, exact_blocks)
    assert torch.equal(p, want_p)
    assert torch.equal(bound, want_bound)


@pytest.mark.parametrize("path", PATHS)
def test_with_every_block_exact_the_pass_is_the_product(path: str) -> None:
    _, matrix = head(3)
    x = rows(4, seed=4)
    p, _ = CompactHead(matrix, range(WIDTH // 32)).bounded(x, path)
    assert torch.equal(p, matrix(x))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("exact_blocks", [(), (1, 3), (0, 1, 2, 3, 4)])
def test_the_head_held_once_is_the_q8_0_head_bit_for_bit(path: str, exact_blocks: tuple[int, ...]) -> None:
    raw, matrix = head(11)
    compact = CompactHead(matrix, exact_blocks)
    for n in (1, 2, 3, 5, 9):
        x = rows(n, seed=n)
        assert torch.equal(compact(x, path), matmul("Q8_0", raw, (VOCAB, WIDTH), x))
    tokens = torch.tensor([0, 15, 16, 101, VOCAB - 1, 15])
    assert torch.equal(compact.rows(tokens, path), matrix.rows(tokens))
    assert compact.nbytes == 13 * (len(exact_blocks) * 544 + (5 - len(exact_blocks)) * 560)
    with pytest.raises(IndexError):
        compact.rows(torch.tensor([VOCAB]))


@pytest.mark.parametrize("exact_blocks", [(), (4,), (0, 2, 4)])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e4])
def test_the_bound_holds_through_the_float32_comparisons(exact_blocks: tuple[int, ...], scale: float) -> None:
    _, matrix = head(5)
    x = rows(6, seed=6, scale=scale)
    p, bound = CompactHead(matrix, exact_blocks).bounded(x)
    full = matrix(x)
    assert bool(((p - bound <= full) & (full <= p + bound)).all())


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n", [1, 2, 5])
@pytest.mark.parametrize("exact_blocks", [(), (0, 1), (0, 1, 2, 3, 4)])
def test_every_paths_argmax_is_the_reference_products(path: str, n: int, exact_blocks: tuple[int, ...]) -> None:
    raw, matrix = head(7)
    x = rows(n, seed=8)
    compact = CompactHead(matrix, exact_blocks)
    tokens, tiles = compact.argmax(x, path)
    expected = matmul("Q8_0", raw, (VOCAB, WIDTH), x).argmax(dim=1)
    assert torch.equal(tokens, expected)
    assert bool(((tiles >= 1) & (tiles <= 13)).all())
    assert torch.equal(compact.full_argmax(x, path), expected)  # the full product, reduced as each tile is computed


@pytest.mark.parametrize("path", PATHS)
def test_a_tie_goes_to_the_lowest_token_on_every_path(path: str) -> None:
    raw, _ = head(9)
    x = rows(3, seed=10)
    original = raw.reshape(VOCAB, -1)
    blocks = original.clone()
    winners = matmul("Q8_0", raw, (VOCAB, WIDTH), x).argmax(dim=1)
    for row, winner in enumerate(winners.tolist()):
        blocks[[VOCAB - 1 - row, row]] = original[winner]  # copies in the last (padded) tile and the first
    tied = blocks.reshape(-1)
    compact = CompactHead(QuantMatrix("Q8_0", tied, (VOCAB, WIDTH)), (1,))
    tokens, _ = compact.argmax(x, path)
    assert torch.equal(tokens, matmul("Q8_0", tied, (VOCAB, WIDTH), x).argmax(dim=1))
    assert tokens.tolist() == [winners.tolist().index(winner) for winner in winners.tolist()]  # the first copy
    assert torch.equal(compact.full_argmax(x, path), tokens)


@pytest.mark.parametrize("path", PATHS)
def test_a_row_whose_pass_is_not_finite_is_left_to_the_full_head(path: str) -> None:
    _, matrix = head(11)
    x = rows(3, seed=12)
    x[1, 7] = float("inf")
    compact = CompactHead(matrix, (2,))
    for tokens in (compact.argmax(x, path)[0], compact.full_argmax(x, path)):
        assert tokens[1] == -1
        assert torch.equal(tokens[[0, 2]], matrix(x[[0, 2]]).argmax(dim=1))


def test_the_calibrated_blocks_are_those_of_the_outlier_channels() -> None:
    assert calibrated_blocks(rows(6), 3) == [0, 1, 2]  # channels 3, 50 and 90


def test_a_head_that_is_not_q8_0_is_refused() -> None:
    raw = random_blocks("Q4_0", 32, 64, seed=1).reshape(-1)
    with pytest.raises(ValueError, match="Q8_0"):
        CompactHead(QuantMatrix("Q4_0", raw, (32, 64)), ())


def test_an_exact_block_outside_the_head_is_refused() -> None:
    _, matrix = head()
    with pytest.raises(ValueError, match="exact block 5 is not one of the head's 5 blocks"):
        CompactHead(matrix, (0, 5))
