"""The qwen35 hybrid (llama.cpp `LLM_ARCH_QWEN35`): gated-delta-net recurrent layers plus gated full attention.

Layer i is full attention when (i + 1) % full_attention_interval == 0, otherwise
a gated delta net. The `nextn_predict_layers` blocks at the end of the file are
the MTP head: not part of the trunk, so they are not run here.

Gated delta net (per layer, per value head; dk = dv = ssm.state_size):
    qkv = causal_conv1d(x @ W_qkv) -> silu          conv state: the last K-1 inputs
    q, k = l2norm(q) / sqrt(dk), l2norm(k)           (key heads repeated to value heads)
    g    = -exp(A_log) * softplus(x @ W_alpha + dt_bias);  beta = sigmoid(x @ W_beta)
    S    = S * exp(g);  S += k (beta (v - S^T k))^T;  o = S^T q     delta state S [dk, dv]
    out  = (rmsnorm(o) * silu(x @ W_gate)) @ W_out
Gated attention: `attn_q` yields [query | gate] per head; out = attn(q, k, v) * sigmoid(gate).
Rope (NEOX) covers the first `rope.dimension_count` dims of each head; for text the
multi-section positions are all equal, so the sections reduce to ordinary rope.

Recurrent state is real state, one per slot: a forward commits each sequence's
state after its last real row, and `rewind` can return to any length in
[end - S, end] (S = `snapshot_rows`, never before the forward's first row);
shorter raises `OutsideResidentWindow`. Rather than a full state per row, a slot
keeps the state its last forward started from and each recurrent layer's inputs
to the recurrence for that forward's rows (the pre-convolution rows, the decay
and beta: about 1/75 of a state a row at Qwen3.6-27B's shape), and a rewind
replays the first rows from there by the same float operations in the same
order, so it arrives at the same bits (`ResidentWindow`). A state's tensors are
never written in place (each row makes new ones), so a checkpoint, the window's
start and the live state share them rather than copy. Padding rows never touch
the recurrent state. A slot also keeps its state at the end of its last whole
prefill chunk, the one length a new request sharing that prompt prefix can
resume from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from typing_extensions import override

from power.runtime.gguf_weights import GGUFFile
from power.runtime.kv_cache import SlotCaches
from power.runtime.layers import Norm, aligned, apply_rope, gated_mlp, rope_rows, rope_tables
from power.runtime.trunks.base import ArchHeader, FixedShapeTrunk, TrunkOptions, Weights, slot_caches
from power.runtime.trunks.batch import DeviceRows, RowBatch
from power.runtime.trunks.protocol import OutsideResidentWindow, TrunkConfig

ARCH = "qwen35"
L2_EPS = 1e-6


@dataclass(frozen=True)
class Qwen35Params:
    d_model: int
    n_layers: int  # trunk layers (block_count minus the nextn blocks)
    d_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    eps: float
    rope_base: float
    rope_dims: int
    interval: int
    conv_kernel: int
    state: int  # dk = dv
    key_heads: int
    value_heads: int
    vocab: int

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> Qwen35Params:
        header = ArchHeader(gguf, ARCH)
        return cls(
            d_model=header.d_model,
            n_layers=header.block_count - int(header.get("nextn_predict_layers", 0)),
            d_ff=header.d_ff,
            n_heads=header.n_heads,
            n_kv_heads=header.n_kv_heads,
            head_dim=header.key_length,
            eps=header.eps,
            rope_base=float(header.get("rope.freq_base", 10_000_000.0)),
            rope_dims=int(header.get("rope.dimension_count", header.key_length)),
            interval=int(header.require("full_attention_interval")),
            conv_kernel=int(header.require("ssm.conv_kernel")),
            state=int(header.require("ssm.state_size")),
            key_heads=int(header.require("ssm.group_count")),
            value_heads=int(header.require("ssm.time_step_rank")),
            vocab=header.vocab,
        )

    def is_recurrent(self, layer: int) -> bool:
        return (layer + 1) % self.interval != 0

    @property
    def conv_channels(self) -> int:
        return self.state * (2 * self.key_heads + self.value_heads)


@dataclass
class RecurrentState:
    """One layer's state. Its tensors are never written in place (a row rebinds them to new ones), so copies share."""

    conv: torch.Tensor  # [channels, K-1]: the last K-1 conv inputs
    delta: torch.Tensor  # [Hv, dk, dv]

    def share(self) -> RecurrentState:
        return RecurrentState(self.conv, self.delta)


@dataclass(frozen=True)
class RecurrentInputs:
    """One layer's inputs to the recurrence for one sequence's rows of a forward, from which the state after any of
    them is replayed exactly: qkv [n, C] before the convolution, decay and beta [n, Hv]."""

    qkv: torch.Tensor
    decay: torch.Tensor
    beta: torch.Tensor


@dataclass
class ResidentWindow:
    """The lengths a slot can rewind to, [first, end]: its state at `start` (where its last forward began) and each
    recurrent layer's inputs for the rows since, replayed up to the length asked."""

    start: int
    first: int
    end: int
    base: dict[int, RecurrentState]
    inputs: dict[int, RecurrentInputs]


class FFN:
    def __init__(self, w: Weights, p: Qwen35Params, b: str) -> None:
        self.norm = w.norm(b + "post_attention_norm.weight", [p.d_model], p.eps)
        self.gate_up = w.fused((b + "ffn_gate.weight", [p.d_ff, p.d_model]), (b + "ffn_up.weight", [p.d_ff, p.d_model]))
        self.down = w.matrix(b + "ffn_down.weight", [p.d_model, p.d_ff])

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return gated_mlp(self.norm(h), self.gate_up, self.down, F.silu)


class GatedDeltaNetLayer:
    def __init__(self, w: Weights, p: Qwen35Params, i: int) -> None:
        b, d, value_dim = f"blk.{i}.", p.d_model, p.state * p.value_heads
        self.attn_norm = w.norm(b + "attn_norm.weight", [d], p.eps)
        self.split_in = [p.conv_channels, value_dim, p.value_heads, p.value_heads]
        self.w_in = w.fused((b + "attn_qkv.weight", [p.conv_channels, d]), (b + "attn_gate.weight", [value_dim, d]),
                            (b + "ssm_beta.weight", [p.value_heads, d]), (b + "ssm_alpha.weight", [p.value_heads, d]))
        self.conv = w.tensor(b + "ssm_conv1d.weight", [p.conv_channels, p.conv_kernel])
        self.dt_bias = w.tensor(b + "ssm_dt.bias", [p.value_heads])
        self.a = w.tensor(b + "ssm_a", [p.value_heads])  # -exp(A_log)
        self.norm = w.norm(b + "ssm_norm.weight", [p.state], p.eps)
        self.l2_norm = Norm(None, L2_EPS, w.kernels)
        self.w_out = w.matrix(b + "ssm_out.weight", [d, value_dim])
        self.ffn = FFN(w, p, b)

    def initial_state(self, p: Qwen35Params, device: str) -> RecurrentState:
        return RecurrentState(torch.zeros(p.conv_channels, p.conv_kernel - 1, device=device),
                              torch.zeros(p.value_heads, p.state, p.state, device=device))

    def __call__(self, h: torch.Tensor, batch: RowBatch, states: list[dict[int, RecurrentState]], layer: int,
                 p: Qwen35Params) -> tuple[torch.Tensor, dict[int, RecurrentInputs]]:
        """Rows [m, d] -> [m, d]; advances each segment's slot state (`states[slot][layer]`) over its rows.

        Also returns {slot: the segment's inputs to the recurrence} (what `replay` reruns).
        """
        x = self.attn_norm(h)
        qkv, z, beta, alpha = self.w_in(x).split(self.split_in, dim=-1)  # [m, C], [m, Hv*dv], [m, Hv], [m, Hv]
        beta = aligned(torch.sigmoid, beta)
        decay = self.a * aligned(F.softplus, alpha + self.dt_bias)  # [m, Hv], log decay <= 0
        out = h.new_zeros(h.shape[0], p.value_heads, p.state)
        inputs = {}
        for segment in batch.segments:
            rows = segment.rows
            inputs[segment.slot] = RecurrentInputs(qkv[rows].clone(), decay[rows].clone(), beta[rows].clone())
            self._recur(inputs[segment.slot], states[segment.slot][layer], out[rows], p)
        gated = self.norm(out) * F.silu(z.view(-1, p.value_heads, p.state))
        h = h + self.w_out(gated.reshape(h.shape[0], -1))
        return h + self.ffn(h), inputs

    def replay(self, inputs: RecurrentInputs, rows: int, state: RecurrentState, p: Qwen35Params) -> None:
        """Advance `state` over the first `rows` rows of `inputs` exactly as the forward did."""
        first = RecurrentInputs(inputs.qkv[:rows], inputs.decay[:rows], inputs.beta[:rows])
        self._recur(first, state, None, p)

    def _recur(self, inputs: RecurrentInputs, state: RecurrentState, out: torch.Tensor | None, p: Qwen35Params) -> None:
        """One sequence's rows through its state: writes `out` [n, Hv, dv] (None: the state alone) and advances
        `state`. Each row's operations read only that row and the state, so the first rows of a forward arrive at the
        same state whether or not the rest follow."""
        n = inputs.qkv.shape[0]
        mixed, state.conv = self._conv(inputs.qkv, state.conv, p)  # [n, C]
        q, k, v = torch.split(mixed, [p.state * p.key_heads, p.state * p.key_heads, p.state * p.value_heads], dim=-1)
        repeat = p.value_heads // p.key_heads
        q = self.l2_norm(q.view(n, p.key_heads, p.state)).repeat_interleave(repeat, dim=1) / math.sqrt(p.state)
        k = self.l2_norm(k.view(n, p.key_heads, p.state)).repeat_interleave(repeat, dim=1)
        v = v.view(n, p.value_heads, p.state)
        s, decay, beta = state.delta, inputs.decay, inputs.beta
        for t in range(n):  # the recurrence, one row at a time: [Hv, dk, dv]
            s = s * decay[t].exp()[:, None, None]
            remembered = (s * k[t][:, :, None]).sum(dim=1)  # [Hv, dv]
            s = s + k[t][:, :, None] * ((v[t] - remembered) * beta[t][:, None])[:, None, :]
            if out is not None:
                out[t] = (s * q[t][:, :, None]).sum(dim=1)
        state.delta = s

    def _conv(self, rows: torch.Tensor, conv_state: torch.Tensor, p: Qwen35Params) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal depthwise conv + silu over rows [n, C]; also the conv state after the last row."""
        window = torch.cat((conv_state, rows.T), dim=1)  # [C, K-1+n]
        n, kernel = rows.shape[0], p.conv_kernel
        out = torch.zeros_like(rows)
        for tap in range(kernel):  # elementwise per tap: every row summed in the same order
            out = out + (self.conv[:, tap:tap + 1] * window[:, tap:tap + n]).T
        return F.silu(out), window[:, n:n + kernel - 1].clone()


class GatedAttentionLayer:
    def __init__(self, w: Weights, p: Qwen35Params, i: int, caches: SlotCaches) -> None:
        b, d, q_dim, kv_dim = f"blk.{i}.", p.d_model, p.n_heads * p.head_dim, p.n_kv_heads * p.head_dim
        self.attn_norm = w.norm(b + "attn_norm.weight", [d], p.eps)
        self.split_qkv = [2 * q_dim, kv_dim, kv_dim]
        self.qkv = w.fused(
            *((b + f"attn_{x}.weight", [rows, d]) for x, rows in zip("qkv", self.split_qkv, strict=True))
        )
        self.q_norm = w.norm(b + "attn_q_norm.weight", [p.head_dim], p.eps)
        self.k_norm = w.norm(b + "attn_k_norm.weight", [p.head_dim], p.eps)
        self.wo = w.matrix(b + "attn_output.weight", [d, q_dim])
        self.ffn = FFN(w, p, b)
        self.caches = caches  # one per slot

    def __call__(self, h: torch.Tensor, batch: DeviceRows, rope: tuple[torch.Tensor, torch.Tensor],
                 p: Qwen35Params) -> torch.Tensor:
        n = h.shape[0]
        x = self.attn_norm(h)
        q_gate, k, v = self.qkv(x).split(self.split_qkv, dim=-1)
        q, gate = q_gate.reshape(n, p.n_heads, 2 * p.head_dim).chunk(2, dim=-1)
        q = self.q_norm(q)
        k = self.k_norm(k.reshape(n, p.n_kv_heads, p.head_dim))
        v = v.reshape(n, p.n_kv_heads, p.head_dim)
        q, k = _partial_rope(q, rope, p.rope_dims), _partial_rope(k, rope, p.rope_dims)
        a = batch.attend(self.caches, q, k, v, 1.0 / math.sqrt(p.head_dim))
        h = h + self.wo(a * torch.sigmoid(gate.reshape(n, -1)))
        return h + self.ffn(h)


class Qwen35Trunk(FixedShapeTrunk):
    def __init__(self, gguf: GGUFFile, options: TrunkOptions) -> None:
        p = self.params = Qwen35Params.from_gguf(gguf)
        w = Weights(gguf, options)
        self.embedding = w.embedding([p.vocab, p.d_model])
        self.layers = [GatedDeltaNetLayer(w, p, i) if p.is_recurrent(i)
                       else GatedAttentionLayer(w, p, i, slot_caches(options, p.n_kv_heads, p.head_dim, p.head_dim))
                       for i in range(p.n_layers)]
        self.rope = rope_tables(options.cache_capacity, p.rope_dims, p.rope_base, device=options.device)
        # Per slot: the lengths it can rewind to (None: only its position), and the state at the end of the slot's
        # last whole prefill chunk (where a new request sharing that prefix may resume).
        self.windows: list[ResidentWindow | None] = [None] * options.slots
        self.chunk_states: list[tuple[int, dict[int, RecurrentState]] | None] = [None] * options.slots
        config = TrunkConfig(architecture=ARCH, vocab_size=p.vocab, d_model=p.d_model, n_layers=p.n_layers,
                             n_ctx=options.n_ctx, verify_capacity=options.verify_capacity,
                             snapshot_rows=options.snapshot_rows, recurrent=True, slots=options.slots,
                             device=options.device)
        output = w.lm_head([p.vocab, p.d_model])
        super().__init__(config, options, w, w.norm("output_norm.weight", [p.d_model], p.eps), output)
        self.states = [self._initial_states() for _ in range(options.slots)]

    def _initial_states(self) -> dict[int, RecurrentState]:
        return {i: layer.initial_state(self.params, self.options.device) for i, layer in enumerate(self.layers)
                if isinstance(layer, GatedDeltaNetLayer)}

    @override
    def _run(self, tokens: torch.Tensor, batch: DeviceRows,
             taps: Sequence[int]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        if not isinstance(batch, RowBatch):  # `capture_graphs` refuses a recurrent trunk, so no graph gets here
            raise TypeError("the qwen35 trunk runs each sequence's rows through its own state: it needs the segments")
        p = self.params
        rope = rope_rows(self.rope, batch.positions)
        before = {s.slot: _share(self.states[s.slot]) for s in batch.segments}
        inputs: dict[int, dict[int, RecurrentInputs]] = {s.slot: {} for s in batch.segments}
        h = self.embedding(tokens)
        tapped = {}
        for i, layer in enumerate(self.layers):
            if i in taps:
                tapped[i] = h
            if isinstance(layer, GatedDeltaNetLayer):
                h, consumed = layer(h, batch, self.states, i, p)
                for slot, rows in consumed.items():
                    inputs[slot][i] = rows
            else:
                h = layer(h, batch, rope, p)
        if p.n_layers in taps:
            tapped[p.n_layers] = h
        for segment in batch.segments:
            end = segment.start + segment.n
            if self.options.snapshot_rows:  # the lengths [end - S, end] this forward passed through
                self.windows[segment.slot] = ResidentWindow(
                    segment.start,
                    max(segment.start, end - self.options.snapshot_rows),
                    end,
                    before[segment.slot],
                    inputs[segment.slot],
                )
            if batch.prefill and end % self.options.prefill_chunk == 0:
                self.chunk_states[segment.slot] = (end, _share(self.states[segment.slot]))
        return h, tapped

    # --- recurrent state ----------------------------------------------------------

    def _rewind_state(self, slot: int, length: int) -> None:
        position, window = self.position_of(slot), self.windows[slot]
        if length == position:
            return
        if window is None or not window.first <= length <= window.end:
            resident = f"[{window.first}, {position}]" if window is not None else f"[{position}, {position}]"
            raise OutsideResidentWindow(f"length {length} is outside the resident window {resident} "
                                        f"(S = {self.options.snapshot_rows})")
        states = _share(window.base)
        for i, state in states.items():
            layer = self.layers[i]
            assert isinstance(layer, GatedDeltaNetLayer)
            layer.replay(window.inputs[i], length - window.start, state, self.params)
        self.states[slot] = states
        window.end = length

    def _state_checkpoint(self, slot: int) -> Any:
        return _share(self.states[slot])

    def _restore_state(self, slot: int, state: Any) -> None:
        self.states[slot] = _share(state)
        self.windows[slot] = None

    def _reset_state(self, slot: int) -> None:
        self.states[slot] = self._initial_states()
        self.windows[slot] = None
        self.chunk_states[slot] = None

    # --- prefix reuse: only where the state at that length was kept ------------------

    def reusable_prefix(self, length: int, slot: int = 0) -> int:
        kept = self.chunk_states[slot]
        return kept[0] if kept is not None and kept[0] <= super().reusable_prefix(length, slot) else 0

    def resume(self, length: int, slot: int = 0) -> None:
        if length == 0:
            self.reset(slot)
            return
        kept = self.chunk_states[slot]
        if kept is None or kept[0] != length or length > self.position_of(slot):
            raise ValueError(f"slot {slot} cannot resume at {length}: its state is kept at "
                             f"{kept[0] if kept else 'no length'}")
        self.restore((length, kept[1]), slot)


def _share(states: dict[int, RecurrentState]) -> dict[int, RecurrentState]:
    """A copy of a slot's states that shares their tensors (never written in place)."""
    return {i: s.share() for i, s in states.items()}


def _partial_rope(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], dims: int) -> torch.Tensor:
    """NEOX rope on the first `dims` dims of each head; the rest pass through."""
    return torch.cat((apply_rope(x[..., :dims], *rope, neox=True), x[..., dims:]), dim=-1)
