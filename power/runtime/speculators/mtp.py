"""MTP: a nextn block as a per-token draft head, from the target file or from its MTP-only sidecar.

The block at `blk.{n_layers}` is one layer of the target's own architecture (its
attention with its own KV cache, its FFN) plus the nextn projection. For the
token t at position j it reads the target's final residual h of position j - 1
(before the output norm):

    x = eh_proj @ concat(enorm(embed(t)), hnorm(h))        [n, d]
    y = the architecture's layer (own KV cache, causal)     [n, d]
    next token = argmax(LM head(shared_head_norm(y)))       y also chains as the next h

With a confidence gate (`spec_draft_p_min`), a proposal ends at the first draft
whose softmax probability is below it, as llama.cpp's draft-mtp does.

`embed(t)` is the target's token embedding times the factor its trunk applies to
it (Gemma: sqrt(d_model); enorm makes the factor matter only through its epsilon,
and the trained head and the runtime use the same one). The LM head is the
target's, cut to the FR prefix.

`commit` queues the rows that landed (each token paired with its predecessor's
hidden row) and the head catches up over them in one pass when it next proposes,
and only then: in a chain the n-gram lookup proposes most rounds of repetitive
text, and a head that ran its layer over every round's rows paid for a cache it
did not read until the lookup failed (on an echo reply its catch-up was 7 % of
the decode time, docs/drafters.md); a parked head's plain rounds pay nothing but
the queueing, and the whole catch-up is charged to the step the head proposes on
(the cost governor's sample). The queue holds at most the context's rows, the
head cache's own size. `propose` then chains from the last committed hidden row
and the anchor, one row per proposal. Draft rows write past the
committed length of the head's cache, where the causal mask never lets a later
committed row read them before they are overwritten. Position 0 has no
predecessor: the head never writes its cache slot, which stays zero.

Which layer a block is depends on the architecture: `BLOCKS` names, per
`general.architecture`, the trunk module's layer that runs it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch
from typing_extensions import override

from power import modes
from power.artifacts.contracts import declared_draft_tokens, nextn_layer_count
from power.documents.arithmetic import QUANTISED
from power.documents.kv_types import F32

from ..gguf_weights import GGUFFile
from ..kv_cache import SlotCaches
from ..layers import rms_norm, rope_rows, rope_tables
from ..trunks.base import TrunkOptions, Weights
from ..trunks.batch import RowBatch, Segment
from ..trunks.gemma3 import Gemma3Layer, Gemma3Params
from ..trunks.qwen35 import GatedAttentionLayer, Qwen35Params
from .base import Decline, DraftContext, Proposal, Speculator, SpeculatorRequest, runs, timed
from .dflash import header_view
from .target_head import TargetHead


@dataclass(frozen=True)
class NextnBlock:
    """One architecture's nextn block as the head runs it: its trunk module's layer at `blk.{trunk_layers}`."""

    layer: Any  # layer(x, batch, rope, params) -> y over `layer.caches` (one slot, its positions: the head's own)
    params: Any
    trunk_layers: int
    d_model: int
    eps: float
    embedding_scale: float  # the factor the trunk applies to its token embedding
    rope: tuple[torch.Tensor, torch.Tensor]
    kv_shape: tuple[int, int, int]  # KV heads, key width, value width


def _qwen35(head_file: GGUFFile, w: Weights, positions: int, kv_type: str) -> NextnBlock:
    """The qwen35 hybrid's block: a gated full-attention layer (partial rope)."""
    p = Qwen35Params.from_gguf(head_file)
    caches = SlotCaches(1, p.n_kv_heads, positions, p.head_dim, p.head_dim, kv_type=kv_type)
    return NextnBlock(GatedAttentionLayer(w, p, p.n_layers, caches), p, p.n_layers, p.d_model, p.eps, 1.0,
                      rope_tables(positions, p.rope_dims, p.rope_base), (p.n_kv_heads, p.head_dim, p.head_dim))


def _gemma3(head_file: GGUFFile, w: Weights, positions: int, kv_type: str) -> NextnBlock:
    """A Gemma 3 layer, global (no window, the header's rope base), with Gemma's embedding scale."""
    p = Gemma3Params.from_gguf(head_file)
    caches = SlotCaches(1, p.n_kv_heads, positions, p.head_dim_k, p.head_dim_v, kv_type=kv_type)
    layer = Gemma3Layer(w, p, p.n_layers, caches, layer_kernels=True)
    return NextnBlock(layer, p, p.n_layers, p.d_model, p.eps, p.embedding_scale, p.rope(True, positions),
                      (p.n_kv_heads, p.head_dim_k, p.head_dim_v))


# general.architecture -> how its nextn block is built
BLOCKS: dict[str, Callable[[GGUFFile, Weights, int, str], NextnBlock]] = {"qwen35": _qwen35, "gemma3": _gemma3}


def build(kind: str, request: SpeculatorRequest) -> Speculator | Decline:
    """The head from the target's own nextn block, or from an MTP-only sidecar (`drafter`) when the plan names one."""
    if request.target is None:
        return Decline(kind, "needs the target GGUF (the nextn head lives in it, or it lends a sidecar its embedding)")
    target = request.target
    head_file = request.drafter or target
    arch = head_file.architecture
    if nextn_layer_count(header_view(head_file)) == 0:
        return Decline(kind, f"{head_file.path} carries no nextn/MTP head ({arch}.nextn_predict_layers)")
    if arch not in BLOCKS:
        return Decline(kind, "the runtime's MTP head is implemented for "
                             f"{', '.join(sorted(BLOCKS))} targets, not {arch}")
    if arch != target.architecture or head_file.get(f"{arch}.embedding_length") != request.trunk.config.d_model:
        return Decline(kind, f"{head_file.path} is a {arch} head of width {head_file.get(f'{arch}.embedding_length')}; "
                             f"the target is {target.architecture} of width {request.trunk.config.d_model}")
    head = TargetHead(request.trunk, target, request.fr_vocab_size, declared_draft_tokens(header_view(head_file)))
    return MTPHead(head_file, head, request.trunk.config.n_ctx, request.p_min, request.kv_type)


@dataclass(frozen=True)
class _Queued:
    """Committed rows the head's cache has not taken yet: `tokens` at [start, start + n), each with its predecessor's
    hidden row."""

    tokens: tuple[int, ...]
    previous: torch.Tensor  # [n, d]
    start: int

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


class MTPHead(Speculator):
    name = modes.MTP

    def __init__(self, head_file: GGUFFile, head: TargetHead, n_ctx: int, p_min: float | None = None,
                 kv_type: str = F32) -> None:
        """`head_file` holds the nextn block (the target itself, or its MTP-only sidecar); `head` is the target's.
        `p_min` (the profile's spec_draft_p_min) ends a proposal at the first draft whose probability is below it.
        `kv_type`: the element type the head's cache holds its rows in (the plan's draft_kv_cache_type)."""
        # A draft head's bits only shape proposals, never tokens: its matrices run in their GGUF blocks.
        w = Weights(head_file, TrunkOptions(n_ctx=n_ctx, verify_capacity=1, arithmetic=QUANTISED))
        self.kv_type = kv_type
        block = self.block = BLOCKS[head_file.architecture](head_file, w, n_ctx + 1, kv_type)
        self.taps = (block.trunk_layers,)  # the final residual before the output norm
        b, d = f"blk.{block.trunk_layers}.nextn.", block.d_model
        self.eh_proj = w.matrix(b + "eh_proj.weight", [d, 2 * d])
        self.enorm = w.tensor(b + "enorm.weight", [d])
        self.hnorm = w.tensor(b + "hnorm.weight", [d])
        self.head_norm = w.tensor(b + "shared_head_norm.weight", [d])
        self.weight_bytes = sum(w.held.values())  # what the head's weights hold (the plan's "MTP head weights")
        self.head = head
        self.p_min = p_min or None  # 0 gates nothing (llama.cpp's default)
        self.capacity = n_ctx
        self.length = 0  # head cache rows committed: positions [1, length) hold real entries once caught up
        self.last_hidden: torch.Tensor | None = None  # the target's final residual at position length - 1
        self.queued: tuple[_Queued, ...] = ()  # committed rows the cache has not taken yet, in position order

    @override
    def begin(self, tokens: Sequence[int]) -> None:
        self.reset()

    def commit(self, tokens: Sequence[int], hidden: dict[int, torch.Tensor], start: int) -> None:
        rows = hidden[self.block.trunk_layers]
        if start != self.length:  # a gap: the head cannot pair the first row with its predecessor
            self.last_hidden = None
        previous = rows[:-1] if self.last_hidden is None else torch.cat([self.last_hidden[None], rows[:-1]])
        paired = list(tokens) if self.last_hidden is not None else list(tokens[1:])
        first = start if self.last_hidden is not None else start + 1
        if paired:  # a copy: the trunk may reuse its output rows on the next forward
            self.queued += (_Queued(tuple(paired), previous[-len(paired) :].clone(), first),)
        self.length, self.last_hidden = start + len(tokens), rows[-1].clone()

    def propose(self, ctx: DraftContext) -> Proposal:
        if ctx.max_tokens <= 0 or self.last_hidden is None:
            return Proposal()
        upkeep_s = timed(self._catch_up)
        drafts, token, h = [], ctx.tokens[-1], self.last_hidden
        for position in range(self.length, min(self.length + ctx.max_tokens, self.capacity)):
            y = self._step([token], h[None], position)
            token, confident = self._draft(rms_norm(y, self.head_norm, self.block.eps))
            if not confident:
                break
            drafts.append(token)
            h = y[0]
        return Proposal(tokens=drafts, head_ran=True, upkeep_s=upkeep_s)

    def _draft(self, normed: torch.Tensor) -> tuple[int, bool]:
        """The head's token for one row, and whether it clears the confidence gate (llama.cpp's draft-mtp stops
        drafting at the first token whose probability is below --spec-draft-p-min: common/speculative.cpp)."""
        if self.p_min is None:
            return self.head.draft_ids(normed)[0], True
        [token], [probability] = self.head.draft_top(normed)
        return token, probability >= self.p_min

    def _catch_up(self) -> None:
        """The head's layer over the queued rows: one pass per run of consecutive positions."""
        for run in runs(self.queued):
            tokens = [token for queued in run for token in queued.tokens]
            self._step(tokens, torch.cat([queued.previous for queued in run]), run[0].start)
        self.queued = ()

    def reset(self) -> None:
        self.length, self.last_hidden, self.queued = 0, None, ()

    def spawn(self) -> MTPHead:
        twin = copy.copy(self)
        layer = copy.copy(self.block.layer)  # the weights are shared, read-only; the cache is the twin's own
        layer.caches = self._cache(self.capacity)
        twin.block = replace(self.block, layer=layer)
        twin.reset()
        return twin

    def checkpoint(self) -> Any:
        return self.length, self.last_hidden, self.queued

    def restore(self, checkpoint: Any) -> None:
        """Rows caught up since the checkpoint are queued again: their second pass writes the same cache entries."""
        self.length, self.last_hidden, self.queued = checkpoint

    def _step(self, tokens: list[int], previous: torch.Tensor, start: int) -> torch.Tensor:
        """Head rows for `tokens` at [start, start + n), each paired with its predecessor's hidden row."""
        block = self.block
        e = rms_norm(self.head.embed(tokens) * block.embedding_scale, self.enorm, block.eps)
        x = self.eh_proj(torch.cat([e, rms_norm(previous, self.hnorm, block.eps)], dim=-1))
        batch = RowBatch(len(tokens), (Segment(0, 0, len(tokens), start),))
        return block.layer(x, batch, rope_rows(block.rope, batch.positions), block.params)

    def _cache(self, n_ctx: int) -> SlotCaches:
        """The head's own cache: one position past the context (the draft row after the last committed one)."""
        heads, key_width, value_width = self.block.kv_shape
        return SlotCaches(1, heads, n_ctx + 1, key_width, value_width, kv_type=self.kv_type)
