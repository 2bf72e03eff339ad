"""What a drafter borrows from its target: the token embedding and the LM head.

Drafters carry neither (the contracts in `docs/contracts.md`); they read them
from the target trunk, as it holds them: the embedding's lookup dequantises only
the rows it needs, and the whole head is the trunk's own LM head (one copy, in
the plan's arithmetic; nothing dequantised beside it). The draft head argmaxes
over its draft vocabulary: the drafter's own list of token IDs when its header
declares one (`contracts.draft_tokens_key`, most frequent first, EAGLE-3's
draft-to-target map), else every ID. FR (`spec_mtp_fr_vocab_size = N`) then
keeps the IDs below N; a cut head holds its rows of the target's LM head in
their GGUF blocks (the draft's bits only shape proposals, never tokens), and the
target's own head and verification are untouched.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..gguf_weights import GGUFFile
from ..linear import Float32Linear, Linear, quantised
from ..trunks.protocol import Trunk


class TargetHead:
    def __init__(self, trunk: Trunk, target: GGUFFile, fr_vocab: int | None = None,
                 draft_tokens: Sequence[int] | None = None) -> None:
        self.embedding, self.output = trunk.embedding, trunk.lm_head  # the trunk's own: nothing held twice
        self.device = trunk.config.device
        vocab = self.output.shape[0]
        if fr_vocab is not None and not 1 <= fr_vocab <= vocab:
            raise ValueError(f"spec_mtp_fr_vocab_size = {fr_vocab} is outside 1..{vocab} (the target's vocabulary)")
        self.fr_vocab = fr_vocab or vocab
        self.draft_vocab = self._vocabulary(draft_tokens, vocab)  # None: every ID below the FR prefix, in order
        ids = self.draft_vocab if self.draft_vocab is not None else torch.arange(self.fr_vocab)
        self.draft = self.output if len(ids) == vocab and self.draft_vocab is None else _cut_head(target, ids, trunk)

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
        """The tokens' embedding rows [n, d] float32 on the CPU (unscaled), exactly dequantised."""
        return self.embedding(torch.tensor(ids, dtype=torch.int64, device=self.device)).cpu()

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [n, N] over the draft vocabulary, on the CPU; `token_ids` turns their indices into token IDs."""
        return self.draft(hidden.float().to(self.device).contiguous()).cpu()

    def token_ids(self, indices: torch.Tensor) -> torch.Tensor:
        return indices if self.draft_vocab is None else self.draft_vocab[indices]

    def draft_ids(self, hidden: torch.Tensor) -> list[int]:
        """The draft head's argmax per row over the draft vocabulary."""
        return self.token_ids(self.draft_logits(hidden).argmax(dim=-1)).tolist()

    def draft_top(self, hidden: torch.Tensor) -> tuple[list[int], list[float]]:
        """The draft head's argmax per row and its probability, the softmax taken over the draft vocabulary (the
        whole vocabulary when the head is not cut, as llama.cpp's sampler takes it)."""
        top = torch.softmax(self.draft_logits(hidden), dim=-1).max(dim=-1)
        return self.token_ids(top.indices).tolist(), top.values.tolist()


def _cut_head(target: GGUFFile, ids: torch.Tensor, trunk: Trunk) -> Linear:
    """The LM head's rows `ids` in their GGUF blocks on the trunk's device (exactly dequantised for a type the
    products do not multiply)."""
    name = "output.weight" if target.has("output.weight") else "token_embd.weight"
    info = target.info(name)
    shape = (len(ids), int(info.shape[1]))
    rows = target.raw(name).view(info.shape[0], -1)[ids].reshape(-1)  # a copy: it outlives the file's bytes
    device = trunk.config.device
    cut = quantised(rows, info.qtype, shape, device, kernels=torch.device(device).type != "cpu")
    return cut if cut is not None else Float32Linear(target.tensor(name)[ids].to(device), rows=1)
