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


def greedy_labels(examples: Sequence[Example]) -> torch.Tensor:
    """Every labelled row's greedy token, in order [rows] (int64)."""
    return torch.cat([e.labels[e.labels >= 0] for e in examples]) if examples else torch.zeros(0, dtype=torch.int64)


def ranked_tokens(examples: Sequence[Example], size: int, vocab: int) -> torch.Tensor | None:
    """The `size` most frequent greedy labels [size] (int64), or None when `size` covers the whole vocabulary."""
    if size >= vocab:
        return None
    counts = torch.bincount(greedy_labels(examples), minlength=vocab)
    return torch.argsort(-counts, stable=True)[:size]


def coverage(examples: Sequence[Example], tokens: torch.Tensor | None) -> float:
    """The share of greedy labels the vocabulary holds (None: every ID)."""
    labels = greedy_labels(examples)
    if not len(labels):
        return 0.0
    return 1.0 if tokens is None else float(torch.isin(labels, tokens).float().mean())
