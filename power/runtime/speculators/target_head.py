"""What a drafter borrows from its target: the token embedding and the LM head.

Drafters carry neither (the contracts in `docs/contracts.md`); they read them
from the target GGUF. With FR (`spec_mtp_fr_vocab_size = N`) only the draft
head's projection is cut to the first N token IDs; the target's own head and
verification are untouched.
"""

from __future__ import annotations

import torch

from power.kernels import dispatch

from ..gguf_weights import GGUFFile


class TargetHead:
    def __init__(self, target: GGUFFile, fr_vocab: int | None = None) -> None:
        self.embedding = target.tensor("token_embd.weight")  # [vocab, d]
        self.output = target.tensor("output.weight") if target.has("output.weight") else self.embedding
        vocab = self.output.shape[0]
        if fr_vocab is not None and not 1 <= fr_vocab <= vocab:
            raise ValueError(f"spec_mtp_fr_vocab_size = {fr_vocab} is outside 1..{vocab} (the target's vocabulary)")
        self.fr_vocab = fr_vocab or vocab

    @property
    def vocab_size(self) -> int:
        return self.output.shape[0]

    def embed(self, ids: list[int]) -> torch.Tensor:
        return self.embedding[torch.tensor(ids, dtype=torch.int64)]  # [n, d]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits [n, vocab] (what a selector or a confidence needs)."""
        return hidden @ self.output.T

    def draft_ids(self, hidden: torch.Tensor) -> list[int]:
        """The draft head's argmax per row over the FR prefix of the vocabulary."""
        return dispatch.fr_argmax(hidden.contiguous(), self.output, self.fr_vocab).tolist()
