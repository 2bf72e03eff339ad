"""Fused greedy verification: argmax of the K+1 verify rows against the K proposals, all on the device.

Row i of the verify logits predicts the token after anchor + proposals[:i]. The
accepted count is the length of the longest prefix of proposals equal to the
rows' argmaxes; the emitted token is the argmax of the first row past it (the
correction after a mismatch, or the bonus token when every proposal matched).
Both results stay on the device as 0-d int64 tensors: no logits cross to the host.
"""

from __future__ import annotations

import torch


def greedy_verify_reference(logits: torch.Tensor, proposals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [K+1, V], proposals [K] -> (accepted count, next token), 0-d int64 tensors."""
    ids = logits.argmax(dim=-1)  # [K+1]
    k = proposals.numel()
    matches = (ids[:k] == proposals).to(torch.int64)
    accepted = matches.cumprod(dim=0).sum()
    return accepted, ids[accepted]
