"""The draft vocabulary of a distilled head: the token IDs it drafts over, most frequent first.

`--fr N` keeps the N token IDs the target chose most often in the training
text (ties and the never-chosen rest in ID order), the frequency-ranked
vocabulary of FR-Spec (arXiv:2502.14856) and EAGLE-3's draft-to-target map
(arXiv:2503.01840). The file declares it (`contracts.draft_tokens_key`), the
runtime's `TargetHead` argmaxes over those rows of the target's LM head, and
training scores each label by its index in the list.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .generate import Example


def ranked_tokens(examples: Sequence[Example], size: int, vocab: int) -> torch.Tensor | None:
    """The `size` most frequent greedy labels [size] (int64), or None when `size` covers the whole vocabulary."""
    if size >= vocab:
        return None
    labels = torch.cat([e.labels[e.labels >= 0] for e in examples]) if examples else torch.zeros(0, dtype=torch.int64)
    counts = torch.bincount(labels, minlength=vocab)
    return torch.argsort(-counts, stable=True)[:size]


def coverage(examples: Sequence[Example], tokens: torch.Tensor | None) -> float:
    """The share of greedy labels the vocabulary holds."""
    labels = torch.cat([e.labels[e.labels >= 0] for e in examples])
    if tokens is None or not len(labels):
        return 1.0 if len(labels) else 0.0
    held = torch.zeros(int(max(int(labels.max()), int(tokens.max())) + 1), dtype=torch.bool)
    held[tokens] = True
    return float(held[labels].float().mean())
