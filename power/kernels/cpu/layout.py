"""The tile layout the CPU kernels read: a GGUF matrix's own blocks, interleaved 16 output rows at a time.

Output rows are grouped in tiles of 16 (the last tile padded with zero rows). Within a tile, block b of
all 16 rows is stored together, `16 * type_size` bytes, field by field in the GGUF block's own order;
each field is interleaved in groups of 4 bytes (2 for a float16 scale): the group's bytes of row 0,
then of row 1, ..., row 15. A 64-byte load is then 4 consecutive bytes of each of the 16 rows (one
32-bit lane per output row), which an integer dot-product instruction multiplies by the same 4
activation bytes in every lane. The bytes are the GGUF bytes, reordered: the layout is exactly as large
(plus the padding rows), and one exception changes bits within a field: Q5_0's 32 fifth bits of a block
are permuted so that the fifth bits of 4 consecutive weights land one per byte (`_q5_0_high_bits`).

F32, F16 and BF16 matrices are the case of a 1-weight block: a tile is [in, 16] in the tensor's dtype.
"""

from __future__ import annotations

import functools

import torch

from power.kernels.dequant import BLOCK_LAYOUT

TILE = 16  # output rows per tile: one per 32-bit lane of a 512-bit register

# (offset, size) of each field of a block, in the block's byte order.
FIELDS: dict[str, tuple[tuple[int, int], ...]] = {
    "Q8_0": ((0, 2), (2, 32)),
    "Q4_0": ((0, 2), (2, 16)),
    "Q5_0": ((0, 2), (2, 4), (6, 16)),
    "Q4_K": ((0, 2), (2, 2), (4, 12), (16, 128)),
    "Q5_K": ((0, 2), (2, 2), (4, 12), (16, 32), (48, 128)),
    "Q6_K": ((0, 128), (128, 64), (192, 16), (208, 2)),
    "F32": ((0, 4),),
    "F16": ((0, 2),),
    "BF16": ((0, 2),),
}
KINDS: dict[str, int] = {name: index for index, name in enumerate(FIELDS)}  # the kernels' `Kind` enum


def tile_matrix(qtype: str, raw: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """GGUF bytes of a [out, in] matrix -> the tile layout, flat uint8 (16 * type_size bytes a block and tile)."""
    out_features, in_features = shape
    block, type_size = BLOCK_LAYOUT[qtype]
    blocks = raw.reshape(out_features, in_features // block, type_size)
    if qtype == "Q5_0":
        blocks = blocks.clone()
        blocks[:, :, 2:6] = _q5_0_high_bits(blocks[:, :, 2:6])
    padding = -out_features % TILE
    if padding:
        blocks = torch.cat((blocks, blocks.new_zeros(padding, *blocks.shape[1:])))
    tiles = blocks.reshape(-1, TILE, blocks.shape[1], type_size)  # [T, 16, nb, type_size]
    parts = []
    for offset, size in FIELDS[qtype]:
        group = min(size, 4)
        field = tiles[..., offset:offset + size].reshape(*tiles.shape[:3], size // group, group)
        parts.append(field.permute(0, 2, 3, 1, 4).reshape(tiles.shape[0], tiles.shape[2], TILE * size))
    return torch.cat(parts, dim=-1).reshape(-1).contiguous()


@functools.cache
def lane_bytes(qtype: str) -> torch.Tensor:
    """int64 [16, type_size]: where row j of a tile finds its block's bytes (in the file's order) among the tile's
    16 * type_size bytes of that block (one shared tensor per type: do not write to it)."""
    _, type_size = BLOCK_LAYOUT[qtype]
    where = torch.empty(TILE, type_size, dtype=torch.int64)
    lanes = torch.arange(TILE)
    for offset, size in FIELDS[qtype]:
        group = min(size, 4)
        for j in range(size):
            where[:, offset + j] = TILE * offset + j // group * TILE * group + lanes * group + j % group
    return where


def _q5_0_high_bits(high: torch.Tensor) -> torch.Tensor:
    """[..., 4] bytes of Q5_0 fifth bits (bit k: weight k) -> the kernels' order.

    Bit 8i + c holds weight 4c + i's fifth bit and bit 8i + 4 + c weight 16 + 4c + i's (i, c in 0..3): the
    kernel reads weights 4c..4c+3 (and 16+4c..) from one 4-byte group, one per byte, and finds their fifth bits
    in bit c (and 4 + c) of the same bytes.
    """
    shifts = torch.arange(8, dtype=torch.uint8)
    bits = ((high[..., None] >> shifts) & 1).reshape(*high.shape[:-1], 32)  # bit k of the u32
    order = torch.empty(32, dtype=torch.long)
    for i in range(4):
        for c in range(4):
            order[8 * i + c] = 4 * c + i
            order[8 * i + 4 + c] = 16 + 4 * c + i
    permuted = bits[..., order].reshape(*high.shape[:-1], 4, 8)
    return (permuted << shifts).sum(dim=-1, dtype=torch.uint8)
