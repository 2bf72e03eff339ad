"""FR draft-head argmax: project hidden rows onto only the first N vocabulary rows and take the argmax.

FR (`spec_mtp_fr_vocab_size`) cuts the draft head to a token-ID prefix; the rows
past N are never read. The Triton kernel fuses the projection with the argmax:
each program scores a fixed chunk of vocabulary rows against a tile of up to
BLOCK_M hidden rows (so the head is read once per tile, not once per row) and
keeps each row's best (value, index); the shared stage-2 reduction
(`power.kernels.argmax_triton`) picks each row's winner, so no [M, N] logits tensor is
written. Scores accumulate in float32; ties resolve to the lowest token ID.
"""

from __future__ import annotations

import torch


def fr_argmax_reference(hidden: torch.Tensor, head_weight: torch.Tensor, n_prefix: int) -> torch.Tensor:
    """hidden [M, d], head_weight [V, d] -> [M] int64 argmax of hidden @ head_weight[:n_prefix].T."""
    return (hidden.float() @ head_weight[:n_prefix].float().T).argmax(dim=-1)
