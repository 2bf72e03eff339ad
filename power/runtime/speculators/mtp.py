"""MTP: the hybrid target's own nextn block as a per-token draft head.

The block at `blk.{n_layers}` is a full gated-attention block of the qwen35 trunk
plus the nextn projection. For the token t at position j it reads the target's
final residual h of position j - 1:

    x = eh_proj @ concat(enorm(embed(t)), hnorm(h))        [n, d]
    y = gated attention block (its own KV cache, causal)    [n, d]
    next token = argmax(LM head(shared_head_norm(y)))       y also chains as the next h

`commit` catches the head up over the rows that landed (pairing each token with
its predecessor's hidden row); `propose` then chains from the last committed
hidden row and the anchor, one row per proposal. Draft rows write past the
committed length of the head's cache, where the causal mask never lets a later
committed row read them before they are overwritten.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import torch
from typing_extensions import override

from power import modes
from power.artifacts.contracts import nextn_layer_count
from power.documents.arithmetic import FLOAT32

from ..gguf_weights import GGUFFile
from ..kv_cache import SlotCaches
from ..layers import rms_norm, rope_rows, rope_tables
from ..trunks.base import TrunkOptions, Weights
from ..trunks.batch import RowBatch, Segment
from ..trunks.qwen35 import GatedAttentionLayer, Qwen35Params
from .base import Decline, DraftContext, Proposal, Speculator, SpeculatorRequest
from .dflash import header_view
from .target_head import TargetHead

# The trunk whose nextn block this head implements.
MTP_ARCHITECTURE = "qwen35"


def build(kind: str, request: SpeculatorRequest) -> Speculator | Decline:
    """The head from the target's own nextn block, or from an MTP-only sidecar (`drafter`) when the plan names one."""
    if request.target is None:
        return Decline(kind, "needs the target GGUF (the nextn head lives in it, or it lends a sidecar its embedding)")
    target = request.target
    head_file = request.drafter or target
    if nextn_layer_count(header_view(head_file)) == 0:
        return Decline(kind, f"{head_file.path} carries no nextn/MTP head ({head_file.architecture}.nextn_predict_layers)")
    if head_file.architecture != MTP_ARCHITECTURE:
        return Decline(kind, f"the runtime's MTP head is implemented for {MTP_ARCHITECTURE} targets, not "
                             f"{head_file.architecture}")
    return MTPHead(head_file, TargetHead(target, request.fr_vocab_size), request.trunk.config.n_ctx)


class MTPHead(Speculator):
    name = modes.MTP

    def __init__(self, head_file: GGUFFile, head: TargetHead, n_ctx: int) -> None:
        """`head_file` holds the nextn block (the target itself, or its MTP-only sidecar); `head` is the target's."""
        p = self.params = Qwen35Params.from_gguf(head_file)
        self.taps = (p.n_layers,)  # the final residual before the output norm
        b = f"blk.{p.n_layers}."
        # A draft head's bits only shape proposals, never tokens: the float32 reference at one row.
        w = Weights(head_file, TrunkOptions(n_ctx=n_ctx, verify_capacity=1, arithmetic=FLOAT32))
        self.block = GatedAttentionLayer(w, p, p.n_layers, self._cache(n_ctx))
        self.eh_proj = w.matrix(b + "nextn.eh_proj.weight", [p.d_model, 2 * p.d_model])
        self.enorm = w.tensor(b + "nextn.enorm.weight", [p.d_model])
        self.hnorm = w.tensor(b + "nextn.hnorm.weight", [p.d_model])
        self.head_norm = w.tensor(b + "nextn.shared_head_norm.weight", [p.d_model])
        self.head = head
        self.rope = rope_tables(n_ctx + 1, p.rope_dims, p.rope_base)
        self.capacity = n_ctx
        self.length = 0  # head cache rows committed: positions [1, length) hold real entries
        self.last_hidden: torch.Tensor | None = None  # the target's final residual at position length - 1

    @override
    def begin(self, tokens: Sequence[int]) -> None:
        self.reset()

    def commit(self, tokens: Sequence[int], hidden: dict[int, torch.Tensor], start: int) -> None:
        rows = hidden[self.params.n_layers]
        if start != self.length:  # a gap: the head cannot pair the first row with its predecessor
            self.last_hidden = None
        previous = rows[:-1] if self.last_hidden is None else torch.cat([self.last_hidden[None], rows[:-1]])
        paired = list(tokens) if self.last_hidden is not None else list(tokens[1:])
        first = start if self.last_hidden is not None else start + 1
        if paired:
            self._step(paired, previous[-len(paired) :], first)
        self.length, self.last_hidden = start + len(tokens), rows[-1]

    def propose(self, ctx: DraftContext) -> Proposal:
        if ctx.max_tokens <= 0 or self.last_hidden is None:
            return Proposal()
        drafts, token, h = [], ctx.tokens[-1], self.last_hidden
        for position in range(self.length, min(self.length + ctx.max_tokens, self.capacity)):
            y = self._step([token], h[None], position)
            token, h = self.head.draft_ids(rms_norm(y, self.head_norm, self.params.eps))[0], y[0]
            drafts.append(token)
        return Proposal(tokens=drafts, head_ran=True)

    def reset(self) -> None:
        self.length, self.last_hidden = 0, None

    def spawn(self) -> MTPHead:
        twin = copy.copy(self)
        twin.block = copy.copy(self.block)
        twin.block.caches = self._cache(self.capacity)
        twin.reset()
        return twin

    def checkpoint(self) -> Any:
        return self.length, self.last_hidden

    def restore(self, checkpoint: Any) -> None:
        self.length, self.last_hidden = checkpoint

    def _step(self, tokens: list[int], previous: torch.Tensor, start: int) -> torch.Tensor:
        """Head rows for `tokens` at [start, start + n), each paired with its predecessor's hidden row."""
        p = self.params
        e = rms_norm(self.head.embed(tokens), self.enorm, p.eps)
        x = self.eh_proj(torch.cat([e, rms_norm(previous, self.hnorm, p.eps)], dim=-1))
        batch = RowBatch(len(tokens), (Segment(0, 0, len(tokens), start),))
        rope = rope_rows(self.rope, batch.positions)
        return self.block(x, batch, rope, p)

    def _cache(self, n_ctx: int) -> SlotCaches:
        """The head's own cache: one position past the context (the draft row after the last committed one)."""
        p = self.params
        return SlotCaches(1, p.n_kv_heads, n_ctx + 1, p.head_dim, p.head_dim)
