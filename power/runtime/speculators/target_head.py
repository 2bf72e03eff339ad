"""What a drafter borrows from its target: the token embedding and the LM head.

Drafters carry neither (the contracts in `docs/contracts.md`); they read them
from the target GGUF. The draft head argmaxes over its draft vocabulary: the
drafter's own list of token IDs when its header declares one
(`contracts.draft_tokens_key`, most frequent first, EAGLE-3's draft-to-target
map), else every ID. FR (`spec_mtp_fr_vocab_size = N`) then keeps the IDs below
N; the target's own head and verification are untouched.
"""

from __future__ import annotations

from typing import Sequence

import torch

from power.kernels import dispatch

from ..gguf_weights import GGUFFile
from ..linear import Linear, quantised


class TargetHead:
    def __init__(self, target: GGUFFile, fr_vocab: int | None = None,
                 draft_tokens: Sequence[int] | None = None) -> None:
        self.embedding = target.tensor("token_embd.weight")  # [vocab, d]
        self.output = target.tensor("output.weight") if target.has("output.weight") else self.embedding
        vocab = self.output.shape[0]
        if fr_vocab is not None and not 1 <= fr_vocab <= vocab:
            raise ValueError(f"spec_mtp_fr_vocab_size = {fr_vocab} is outside 1..{vocab} (the target's vocabulary)")
        self.fr_vocab = fr_vocab or vocab
        self.draft_vocab = self._vocabulary(draft_tokens, vocab)  # None: every ID below the FR prefix, in order
        ids = self.draft_vocab if self.draft_vocab is not None else torch.arange(self.fr_vocab)
        self.draft_rows = self.output[ids] if self.draft_vocab is not None else self.output[: self.fr_vocab]  # [N, d]
        # A cut head on the CPU runs in its GGUF blocks (the draft's bits only shape proposals, never tokens).
        self._quantised = _quantised_rows(target, ids) if len(ids) < vocab else None

    def _vocabulary(self, draft_tokens: Sequence[int] | None, vocab: int) -> torch.Tensor | None:
        if draft_tokens is None:
            return None
        ids = torch.tensor(list(draft_tokens), dtype=torch.int64)
        if not len(ids) or int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise ValueError(f"the drafter's draft vocabulary must name token IDs in 0..{vocab - 1}")
        kept = ids[ids < self.fr_vocab]
        if not len(kept):
            raise ValueError(f"spec_mtp_fr_vocab_size = {self.fr_vocab} keeps none of the drafter's draft vocabulary")
        return kept

    @property
    def vocab_size(self) -> int:
        return self.output.shape[0]

    def embed(self, ids: list[int]) -> torch.Tensor:
        return self.embedding[torch.tensor(ids, dtype=torch.int64)]  # [n, d]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits [n, vocab] (what a selector or a confidence needs)."""
        return hidden @ self.output.T

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [n, N] over the draft vocabulary; `token_ids` turns their indices into token IDs."""
        return hidden @ self.draft_rows.T

    def token_ids(self, indices: torch.Tensor) -> torch.Tensor:
        return indices if self.draft_vocab is None else self.draft_vocab[indices]

    def draft_ids(self, hidden: torch.Tensor) -> list[int]:
        """The draft head's argmax per row over the draft vocabulary."""
        if (quantised := self._quantised_for(hidden)) is not None:
            best = quantised(hidden.float().contiguous()).argmax(dim=-1)
        else:
            best = dispatch.fr_argmax(hidden.contiguous(), self.draft_rows, len(self.draft_rows))
        return self.token_ids(best.cpu()).tolist()

    def draft_top(self, hidden: torch.Tensor) -> tuple[list[int], list[float]]:
        """The draft head's argmax per row and its probability, the softmax taken over the draft vocabulary (the
        whole vocabulary when the head is not cut, as llama.cpp's sampler takes it)."""
        if (quantised := self._quantised_for(hidden)) is not None:
            logits = quantised(hidden.float().contiguous())
        else:
            logits = self.draft_logits(hidden.to(self.draft_rows.dtype))
        top = torch.softmax(logits.float(), dim=-1).max(dim=-1)
        return self.token_ids(top.indices.cpu()).tolist(), top.values.cpu().tolist()

    def _quantised_for(self, hidden: torch.Tensor) -> Linear | None:
        """The cut head's rows in their GGUF blocks when they multiply these rows (on the CPU), else None."""
        return self._quantised if hidden.device.type == "cpu" else None


def _quantised_rows(target: GGUFFile, ids: torch.Tensor) -> Linear | None:
    """The LM head's rows `ids` in their GGUF blocks for the CPU kernels (None for a type they do not multiply)."""
    name = "output.weight" if target.has("output.weight") else "token_embd.weight"
    info = target.info(name)
    rows = target.raw(name).view(info.shape[0], -1)[ids].reshape(-1)  # a copy: it outlives the file's bytes
    return quantised(rows, info.qtype, (len(ids), info.shape[1]), "cpu")
