"""DFlash block drafters (v1 and DFlash2: one code path, keyed off the header).

The drafter reads the target's residuals, not only its tokens, and proposes a
whole block in one forward:

    PASS A  encoder    feat = concat(target residual entering each of target_layers)   [n, L*d]
                       g    = rmsnorm(fc @ feat, enc.output_norm)                        [n, d]
    PASS B  KV inject  per layer: K = rope(k_norm(attn_k @ g)), V = attn_v @ g -> the drafter's own ring
    PASS C  block      ids = [anchor, MASK x (block_size - 1)] -> layers (attending to the ring and,
                       bidirectionally, to the block) -> output_norm -> the target's LM head

DFlash2 adds, when its header carries them (the file decides, not its name):
- a grouped dynamic depthwise convolution around every attention and FFN
  sublayer: tap t of channel c at block row r is base[t][c] + delta[r][t][c // group],
  multiplying x[r - t][c], zero for r < t (never across the block boundary); one
  projection of the sublayer's input yields the deltas for both its input and output;
- the candidate selector: top-k candidates per position scored through two
  low-rank codebooks, score = unary[c] + <A[pred] * (P h), B[cand]>, read off as a
  greedy walk from the verified anchor. The unary term is the target LM head's
  logit after the drafter's logit_scale and final_logit_softcapping.

The target's KV cache is untouched: the ring holds the drafter's sliding window
(`dflash.attention.sliding_window`), or the whole context when none is declared.

`commit` only queues the tapped rows that landed; passes A and B run over the
queue in one go when the drafter next proposes, so a round it does not propose
on (the cost governor parked it, or a lookup in front of it proposed) costs what
a target-only round costs, and the upkeep is charged to the step it proposes on.
Rows the window would evict before that are dropped from the queue unrun.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from typing_extensions import override

from power import modes
from power.artifacts.contracts import (
    PRODUCT,
    ROWS,
    DrafterHparams,
    classify_drafter,
    declared_draft_tokens,
    drafter_hparams,
    drafter_tensor_role,
    required,
)

from ..embedding import TokenEmbedding
from ..gguf_weights import GGUFFile
from ..layers import apply_rope, attention, gated_mlp, linear, rms_norm, rope_tables, softcap
from ..linear import Float32Linear, Linear, Stacked, quantised
from .base import Decline, DraftContext, Proposal, Speculator, SpeculatorRequest, runs, timed, within_window
from .kv_ring import KVRing
from .target_head import TargetHead


def grouped_conv(x: torch.Tensor, base: torch.Tensor, delta: torch.Tensor, group: int) -> torch.Tensor:
    """x [..., B, d]; base [K, d] static taps; delta [..., B, K, d / group] dynamic per-group taps -> [..., B, d],
    causal in-block (the leading dimensions: blocks side by side, as training runs them)."""
    kernel = base.shape[0]
    taps = (base.view(kernel, -1, group) + delta[..., None]).flatten(-2)  # [..., B, K, d]: each group's delta broadcast
    rows = x.shape[-2]
    out = torch.zeros_like(x)
    for t in range(min(kernel, rows)):
        out[..., t:, :] += taps[..., t:, t, :] * x[..., : rows - t, :]
    return out


@dataclass(frozen=True)
class _Queued:
    """Committed rows the ring has not taken yet: the tapped features of positions [start, start + n)."""

    start: int
    features: torch.Tensor  # [n, L*d]

    @property
    def end(self) -> int:
        return self.start + len(self.features)


@dataclass(frozen=True)
class _HeaderView:
    """What `power.artifacts.contracts` reads from a header, over the runtime's GGUF reader."""

    path: str
    architecture: str
    metadata: Mapping[str, Any]
    tensor_shapes: Mapping[str, tuple[int, ...]]


def _held(drafter: GGUFFile, name: str) -> Linear | TokenEmbedding | torch.Tensor:
    """How the drafter holds tensor `name` (`power.artifacts.contracts.drafter_tensor_role`): a matrix that multiplies
    activations in its GGUF blocks, through the CPU kernels as the target's (exactly dequantised for a type they do not
    multiply), a token-indexed table as its GGUF rows, anything else in float32."""
    info = drafter.info(name)
    role = drafter_tensor_role(name)
    if role == PRODUCT:
        shape = (int(info.shape[0]), int(info.shape[1]))
        packed = quantised(drafter.raw(name), info.qtype, shape, "cpu")
        return packed if packed is not None else Float32Linear(drafter.tensor(name), rows=0)
    if role == ROWS:
        return TokenEmbedding.of_gguf(drafter, name, info.shape)
    return drafter.tensor(name)


def held_bytes(weights: Mapping[str, Linear | TokenEmbedding | torch.Tensor]) -> int:
    """What a drafter's weights hold in memory (the plan's "drafter weights")."""
    return sum(w.numel() * w.element_size() if isinstance(w, torch.Tensor) else w.nbytes for w in weights.values())


def header_view(gguf: GGUFFile) -> _HeaderView:
    return _HeaderView(str(gguf.path), gguf.architecture, gguf.metadata, {n: i.shape for n, i in gguf.tensors.items()})


def load_block_drafter(kind: str, request: SpeculatorRequest) -> tuple[GGUFFile, TargetHead] | Decline:
    """The drafter file and the target head it borrows, once the header says it is a `kind` drafter for this trunk."""
    if request.drafter is None or request.target is None:
        return Decline(kind, f"needs a {kind} drafter artifact and the target GGUF; the plan names none")
    drafter = request.drafter
    found = classify_drafter(header_view(drafter))
    if found != kind:
        return Decline(kind, f"{drafter.path} is a {found or 'non-drafter'} artifact by its header, not {kind}")
    config = request.trunk.config
    width = drafter.get(f"{drafter.architecture}.embedding_length")
    if width != config.d_model:
        return Decline(kind, f"drafter width {width} does not match the target's d_model {config.d_model}")
    layers = drafter.get(f"{drafter.architecture}.target_layers", [])
    if any(not 0 <= layer <= config.n_layers for layer in layers):
        return Decline(kind, f"drafter reads target layers {list(layers)}; the target has {config.n_layers}")
    return drafter, TargetHead(request.trunk, request.target, request.fr_vocab_size,
                               declared_draft_tokens(header_view(drafter)))


def build(kind: str, request: SpeculatorRequest) -> Speculator | Decline:
    loaded = load_block_drafter(kind, request)
    if isinstance(loaded, Decline):
        return loaded
    return BlockDrafter(*loaded, context_rows=request.trunk.config.n_ctx)


class BlockDrafter(Speculator):
    """The DFlash backbone; DFlash2's convolution and selector switch on when the header carries them."""

    name = modes.DFLASH

    def __init__(self, drafter: GGUFFile, head: TargetHead, context_rows: int) -> None:
        self.hp: DrafterHparams = drafter_hparams(header_view(drafter))
        self.head = head
        # tensor -> its matrix in GGUF blocks (a `Linear`), its GGUF rows (a `TokenEmbedding`) or a float32 tensor
        self.w: dict[str, Any] = {name: _held(drafter, name) for name in drafter.tensors}
        self.layers = [self._layer_weights(i) for i in range(self.hp.block_count)]
        self.taps = tuple(self.hp.target_layers)
        self.max_proposals = self.hp.block_size - 1
        kernel, group = self.hp.conv_kernel_size, self.hp.conv_group_size
        # DFlash2's grouped dynamic convolution: (taps, channels per group), or None without one.
        self.conv_shape = (kernel, required(group, "conv_group_size")) if kernel is not None else None
        self.selector = "selector_hidden.weight" in self.w
        if self.conv or self.selector:
            self.name = modes.DFLASH2
        self.window_rows = min(self.hp.sliding_window or context_rows, context_rows)
        self.ring = KVRing(self.hp.block_count, self.window_rows, self.hp.head_count_kv, self.hp.head_dim)
        self.queued: tuple[_Queued, ...] = ()  # committed rows the ring has not taken yet, in position order
        self._cos, self._sin = rope_tables(context_rows + self.hp.block_size, self.hp.head_dim, self.hp.rope_freq_base)

    @property
    def conv(self) -> bool:
        return self.conv_shape is not None

    # --- the speculator interface ---------------------------------------------
    @override
    def begin(self, tokens: Sequence[int]) -> None:
        self.reset()

    @override
    def commit(self, tokens: Sequence[int], hidden: dict[int, torch.Tensor], start: int) -> None:
        features = torch.cat([hidden[layer] for layer in self.taps], dim=-1)  # a copy: [n, L*d]
        self.queued = within_window((*self.queued, _Queued(start, features)), self.window_rows)

    def propose(self, ctx: DraftContext) -> Proposal:
        n = min(ctx.max_tokens, self.hp.block_size - 1)
        if n <= 0:
            return Proposal()
        upkeep_s = timed(self._catch_up)
        rows = self._block(ctx.tokens[-1])[1 : 1 + n]  # PASS C: the MASK rows, normed
        return Proposal(tokens=self._read_block(ctx.tokens[-1], rows), head_ran=True, upkeep_s=upkeep_s)

    def reset(self) -> None:
        self.ring.reset()
        self.queued = ()

    def spawn(self) -> BlockDrafter:
        twin = copy.copy(self)  # the weights and rope tables are shared, read-only
        twin.ring = self.ring.empty_like()
        twin.queued = ()
        return twin

    def checkpoint(self) -> Any:
        """The ring's extent and the queue: a round's catch-up writes only queued rows past the ring's length, and a
        restore queues them again, so the next catch-up rewrites those slots before anything reads the window."""
        return self.ring.extent, self.queued

    def restore(self, checkpoint: Any) -> None:
        extent, self.queued = checkpoint
        self.ring.extent = extent

    # --- the passes ------------------------------------------------------------
    def _catch_up(self) -> None:
        """PASS A and B over the queued rows: one pass per run of consecutive positions (a gap, an adopted prefix
        or rows dropped from the queue, restarts the ring there)."""
        for run in runs(self.queued):
            start = run[0].start
            if start != self.ring.length:
                self.ring.jump(start)
            feat = torch.cat([queued.features for queued in run])  # PASS A
            g = rms_norm(linear(feat, self.w["fc.weight"]), self.w["enc.output_norm.weight"], self.hp.rms_epsilon)
            positions = torch.arange(start, start + len(feat))
            keys, values = zip(*(self._inject(i, g, positions) for i in range(self.hp.block_count)), strict=True)  # B
            self.ring.write(start, torch.stack(keys), torch.stack(values))
        self.queued = ()

    def _inject(self, layer: int, g: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w, hp = self.layers[layer], self.hp
        k = linear(g, w["attn_k"]).view(len(g), hp.head_count_kv, hp.head_dim)
        v = linear(g, w["attn_v"]).view(len(g), hp.head_count_kv, hp.head_dim)
        return self._rope(rms_norm(k, w["attn_k_norm"], hp.rms_epsilon), positions), v

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return apply_rope(x, self._cos[positions], self._sin[positions], neox=True)

    def _block(self, anchor: int) -> torch.Tensor:
        """The block forward: [block_size, d] normed hidden rows; row 0 is the anchor."""
        ids = [anchor] + [self.hp.mask_token_id] * (self.hp.block_size - 1)
        positions = torch.arange(self.ring.length, self.ring.length + len(ids))
        x = self.head.embed(ids)
        for layer, w in enumerate(self.layers):
            x = self._sublayer(x, w, "attn", lambda u, w=w, layer=layer: self._attention(u, w, layer, positions))
            x = self._sublayer(x, w, "ffn", lambda u, w=w: self._ffn(u, w))
        return rms_norm(x, self.w["output_norm.weight"], self.hp.rms_epsilon)

    def _sublayer(self, x: torch.Tensor, w: dict[str, torch.Tensor], kind: str, fn) -> torch.Tensor:
        u = rms_norm(x, w[f"{kind}_norm"], self.hp.rms_epsilon)
        if self.conv_shape is None:
            return x + fn(u)
        k, group = self.conv_shape
        base = w[f"{kind}_conv_base"]  # [2K, d]: input taps, then output taps
        delta = linear(u, w[f"{kind}_conv_proj"]).view(len(u), 2, k, -1)
        y = fn(grouped_conv(u, base[:k], delta[:, 0], group))
        return x + grouped_conv(y, base[k:], delta[:, 1], group)

    def _attention(self, u: torch.Tensor, w: dict[str, torch.Tensor], layer: int,
                   positions: torch.Tensor) -> torch.Tensor:
        """The block's rows attend to the ring's resident positions and, bidirectionally, to each other."""
        hp, n = self.hp, len(u)
        q = linear(u, w["attn_q"]).view(n, hp.head_count, hp.head_dim)
        k = linear(u, w["attn_k"]).view(n, hp.head_count_kv, hp.head_dim)
        v = linear(u, w["attn_v"]).view(n, hp.head_count_kv, hp.head_dim)
        q = self._rope(rms_norm(q, w["attn_q_norm"], hp.rms_epsilon), positions)
        k = self._rope(rms_norm(k, w["attn_k_norm"], hp.rms_epsilon), positions)
        ring_k, ring_v, _ = self.ring.window(layer)
        keys = torch.cat([ring_k, k]).transpose(0, 1)  # [Hkv, ctx + n, hd]
        values = torch.cat([ring_v, v]).transpose(0, 1)
        visible = torch.zeros(n, keys.shape[1])
        out = attention(q, keys, values, visible, 1.0 / math.sqrt(hp.head_dim))
        return linear(out, w["attn_output"])

    @staticmethod
    def _ffn(u: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
        return gated_mlp(u, lambda x: linear(x, w["ffn_gate_up"]), lambda x: linear(x, w["ffn_down"]), F.silu)

    def _layer_weights(self, i: int) -> dict[str, torch.Tensor]:
        prefix = f"blk.{i}."
        weights = {name[len(prefix) :].removesuffix(".weight"): t for name,
                   t in self.w.items() if name.startswith(prefix)}
        return weights | {"ffn_gate_up": Stacked((weights["ffn_gate"], weights["ffn_up"]))}

    # --- reading a block out ----------------------------------------------------
    def _read_block(self, anchor: int, rows: torch.Tensor) -> list[int]:
        if not self.selector:
            return self.head.draft_ids(rows)  # independent argmax per position
        return self._selector_walk(anchor, rows)

    def _selector_walk(self, anchor: int, rows: torch.Tensor) -> list[int]:
        unary = self._unary(self.head.draft_logits(rows))  # [E, N]
        scores, picks = unary.topk(required(self.hp.selector_top_k, "selector_top_k"), dim=-1)  # [E, k]
        cands = self.head.token_ids(picks)
        projected = linear(rows, self.w["selector_hidden.weight"])  # [E, r]
        pred_book, succ_book = self.w["selector_predecessor.weight"], self.w["selector_successor.weight"]
        walk, pred = [], anchor
        for e in range(len(rows)):
            transition = (pred_book[pred] * projected[e]) @ succ_book[cands[e]].T  # [k]
            pred = int(cands[e][int(torch.argmax(scores[e] + transition))])
            walk.append(pred)
        return walk

    def _unary(self, logits: torch.Tensor) -> torch.Tensor:
        return softcap(logits * (self.hp.logit_scale or 1.0), self.hp.final_logit_softcapping)
