"""DSpark: the DFlash backbone plus a sequential Markov head and confidence-scheduled verification.

Plain block diffusion picks each position independently; DSpark's Markov head
conditions position e on the token drafted at e - 1 (the verified anchor for the
first), cheaply, without a second backbone pass:

    h'_e  = h_e + markov.output(markov.hidden(h_e) * markov.token_embd[pred_e])
    draft = argmax(target LM head(rmsnorm(h'_e, markov.norm)))
    conf  = sigmoid(confidence . h'_e + bias)

Confidence-scheduled verification: the block is cut at the first position whose
confidence is below `dspark.confidence_threshold`, so rows likely to be rejected
are never verified. A block cut at its first position proposes nothing, but its
head pass still ran (the governor counts that step as speculative).
"""

from __future__ import annotations

import torch

from .base import DraftContext, Proposal
from ..layers import rms_norm
from .dflash import BlockDrafter


class DSparkDrafter(BlockDrafter):
    name = "dspark"
    # The operator's confidence gate (TensorSharp's --spec-pmin); None keeps the header's threshold.
    threshold_override: float | None = None

    @property
    def threshold(self) -> float:
        return self.hp.confidence_threshold if self.threshold_override is None else self.threshold_override

    def propose(self, ctx: DraftContext) -> Proposal:
        n = min(ctx.max_tokens, self.hp.block_size - 1)
        if n <= 0:
            return Proposal()
        rows = self._block(ctx.tokens[-1])[1 : 1 + n]
        drafts, pred = [], ctx.tokens[-1]
        for h in rows:
            h = h + self._markov(h, pred)
            if self._confidence(h) < self.threshold:
                break
            pred = self.head.draft_ids(rms_norm(h, self.w["markov.norm.weight"], self.hp.rms_epsilon)[None])[0]
            drafts.append(pred)
        return Proposal(tokens=drafts, head_ran=True)

    def _markov(self, h: torch.Tensor, pred: int) -> torch.Tensor:
        w = self.w
        return ((w["markov.hidden.weight"] @ h) * w["markov.token_embd.weight"][pred]) @ w["markov.output.weight"].T

    def _confidence(self, h: torch.Tensor) -> float:
        return float(torch.sigmoid(self.w["confidence.weight"][0] @ h + self.w["confidence.bias"][0]))
