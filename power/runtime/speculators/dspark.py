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

from power import modes
from power.artifacts.contracts import required

from ..gguf_weights import GGUFFile
from ..layers import linear, rms_norm
from .base import Decline, DraftContext, Proposal, Speculator, SpeculatorRequest, timed
from .dflash import BlockDrafter, load_block_drafter
from .target_head import TargetHead


def build(kind: str, request: SpeculatorRequest) -> Speculator | Decline:
    loaded = load_block_drafter(kind, request)
    if isinstance(loaded, Decline):
        return loaded
    return DSparkDrafter(*loaded, context_rows=request.trunk.config.n_ctx, p_min=request.p_min)


class DSparkDrafter(BlockDrafter):
    name = modes.DSPARK

    def __init__(self, drafter: GGUFFile, head: TargetHead, context_rows: int, p_min: float | None = None) -> None:
        super().__init__(drafter, head, context_rows)
        # The operator's confidence gate (the profile's spec_draft_p_min); None keeps the header's threshold.
        self.threshold = required(self.hp.confidence_threshold, "confidence_threshold") if p_min is None else p_min

    def propose(self, ctx: DraftContext) -> Proposal:
        n = min(ctx.max_tokens, self.hp.block_size - 1)
        if n <= 0:
            return Proposal()
        upkeep_s = timed(self._catch_up)
        rows = self._block(ctx.tokens[-1])[1 : 1 + n]
        drafts, pred = [], ctx.tokens[-1]
        for h in rows:
            h = h + self._markov(h, pred)
            if self._confidence(h) < self.threshold:
                break
            pred = self.head.draft_ids(rms_norm(h, self.w["markov.norm.weight"], self.hp.rms_epsilon)[None])[0]
            drafts.append(pred)
        return Proposal(tokens=drafts, head_ran=True, upkeep_s=upkeep_s)

    def _markov(self, h: torch.Tensor, pred: int) -> torch.Tensor:
        w = self.w
        token = w["markov.token_embd.weight"](torch.tensor([pred]))  # [1, r]: the one row it reads
        return linear(linear(h[None], w["markov.hidden.weight"]) * token, w["markov.output.weight"])[0]

    def _confidence(self, h: torch.Tensor) -> float:
        return float(torch.sigmoid(self.w["confidence.weight"][0] @ h + self.w["confidence.bias"][0]))
