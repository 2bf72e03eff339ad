"""The memory model: per-component device bytes, each traceable to GGUF header fields.

Components (docs/sizing.md gives every constant and where it comes from):

    target weights        tensor bytes by quant type, for what sits on the device
    target KV (global)    n_head_kv(l) x (head_dim_k + head_dim_v) x ctx cells x type size
    target KV (sliding)   the same over min(ctx, pad(n_swa + n_ubatch, 256)) cells, as llama.cpp's iSWA cache
    recurrent state       (conv + ssm state) x (1 + S snapshots), f32, for recurrent layers (no KV)
    MTP head              nextn block weights, and their KV over the whole context
    drafter weights       the external drafter's tensor bytes
    drafter KV            its declared sliding window, else the whole target context
    FR projection         the first N rows of the output matrix, copied for the draft head
    compute + logits      activations and logits at the verification capacity (f32)
    CUDA context, graphs  fixed overheads
    headroom              kept free on the device (the host's setting)

Layers come one by one from `ArtifactFacts.layers` (power.artifacts.facts): a
per-layer `head_count_kv` array is honoured element by element, sliding-window
layers follow the header's pattern (or llama.cpp's per-architecture rule when the
header carries none), recurrent layers carry state instead of KV, and the nextn
blocks of an MTP head are charged only when MTP runs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal

from power.artifacts.contracts import drafter_kv_bytes_per_position
from power.artifacts.facts import NEXTN, RECURRENT, SLIDING, ArtifactFacts, LayerFacts
from power.artifacts.ggml_types import QUANT_BY_NAME
from power.artifacts.gguf_reader import TensorInfo
from power.orchestrator.units import format_size

MiB = 1024**2
# llama.cpp pads the context and the SWA cache to 256 cells (llama_kv_cache: n_pad).
KV_PAD = 256
# llama.cpp's default n_ubatch: the SWA cache keeps n_swa + n_ubatch cells, and prefill runs in micro-batches this tall.
LLAMA_N_UBATCH = 512
# Recurrent conv and ssm state are f32 in llama.cpp (type_r, type_s).
STATE_BYTES = 4
# CUDA context + cuBLAS workspace + loaded kernel images (docs/sizing.md).
CUDA_CONTEXT_BYTES = 384 * MiB
# CUDA graph pool per captured shape, and the shapes Power captures (target verify, drafter propose).
CUDA_GRAPH_BYTES_PER_SHAPE = 64 * MiB
# A margin below this after the headroom needs a quiet device (the seeds: 23,847 MiB peak on 24 GiB).
THIN_MARGIN_BYTES = 1024 * MiB


@dataclass(frozen=True)
class Component:
    name: str
    bytes: int
    detail: str


@dataclass(frozen=True)
class Budget:
    device_bytes: int
    headroom_bytes: int


@dataclass(frozen=True)
class Request:
    """The settings sizing depends on, from the profile and the resolved mode."""

    ctx: int
    verify_rows: int
    snapshots: int  # S, resident recurrent snapshots
    kv_cache_type: str = "f16"
    flash_attn: bool = False
    cuda_graphs: bool = True
    gpu_layers: int | None = None  # None: every layer on the device
    use_mtp: bool = False
    fr_vocab_size: int | None = None
    vocab: int = 0  # the target's vocabulary: logits rows, and the LM head drafters borrow


@dataclass(frozen=True)
class Sizing:
    ctx: int
    components: tuple[Component, ...]
    budget: Budget
    max_ctx: int | None = None

    @property
    def total_bytes(self) -> int:
        return sum(c.bytes for c in self.components)

    @property
    def margin_bytes(self) -> int:
        """What is left after the headroom; negative when the plan eats into it or overflows."""
        return self.budget.device_bytes - self.budget.headroom_bytes - self.total_bytes

    @property
    def verdict(self) -> Literal["fits", "fits-below-headroom", "does-not-fit"]:
        if self.margin_bytes >= 0:
            return "fits"
        if self.total_bytes <= self.budget.device_bytes:
            return "fits-below-headroom"
        return "does-not-fit"

    @property
    def thin(self) -> bool:
        return self.verdict == "fits" and self.margin_bytes < THIN_MARGIN_BYTES


def type_bytes(n_elements: int, type_name: str) -> int:
    """Bytes of n elements of a GGML type (block-quantised types count whole blocks)."""
    quant = QUANT_BY_NAME[type_name.upper()]
    return -(-n_elements // quant.block_size) * quant.type_size


def pad(value: int, to: int) -> int:
    return -(-value // to) * to


def whole(value: Any, default: int = 0) -> int:
    """An integer hparam, or `default` when the header lacks it or carries another type (its checks report that)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def largest(value: Any, default: int) -> int:
    """The largest layer's value of a scalar or per-layer array hparam (the compute buffer is sized for it)."""
    if isinstance(value, (list, tuple)):
        return max((whole(v) for v in value), default=default)
    return whole(value, default)


def kv_bytes_per_cell(layer: LayerFacts, cache_type: str) -> int:
    return type_bytes(layer.n_head_kv * (layer.head_dim_k + layer.head_dim_v), cache_type)


def trunk_layers(facts: ArtifactFacts) -> list[LayerFacts]:
    return [layer for layer in facts.layers if layer.kind != NEXTN]


# --- components ---------------------------------------------------------------


def kv_cells(layer: LayerFacts, ctx: int, window: int | None) -> int:
    if layer.kind == RECURRENT:
        return 0
    ctx_cells = pad(ctx, KV_PAD)
    if layer.kind == SLIDING and window:
        return min(ctx_cells, pad(window + LLAMA_N_UBATCH, KV_PAD))
    return ctx_cells


def kv_components(layers: list[LayerFacts], ctx: int, window: int | None, cache_type: str, label: str) -> list[Component]:
    """One component per layer kind, summed layer by layer (each layer with its own kv-head count)."""
    by_kind: dict[str, list[int]] = {}
    for layer in layers:
        if layer.kind != RECURRENT:
            by_kind.setdefault(layer.kind, []).append(kv_bytes_per_cell(layer, cache_type) * kv_cells(layer, ctx, window))
    out = []
    for kind, sizes in by_kind.items():
        sample = next(l for l in layers if l.kind == kind)
        cells = kv_cells(sample, ctx, window)
        heads = sorted({l.n_head_kv for l in layers if l.kind == kind})
        out.append(Component(f"{label} ({kind})", sum(sizes),
                             f"{len(sizes)} layers x n_head_kv {'/'.join(map(str, heads))} x "
                             f"(k {sample.head_dim_k} + v {sample.head_dim_v}) x {cells} cells x {cache_type}"))
    return out


def recurrent_component(facts: ArtifactFacts, layers: list[LayerFacts], snapshots: int) -> Component | None:
    n_recurrent = sum(1 for layer in layers if layer.kind == RECURRENT)
    if not n_recurrent:
        return None
    d_conv = whole(facts.hparam("ssm.conv_kernel"))
    d_inner = whole(facts.hparam("ssm.inner_size"))
    d_state = whole(facts.hparam("ssm.state_size"))
    n_group = whole(facts.hparam("ssm.group_count"))
    # llama_hparams::n_embd_r (conv state) and n_embd_s (ssm / delta state)
    conv = max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state)
    state = d_state * d_inner
    copies = 1 + snapshots
    total = n_recurrent * (conv + state) * STATE_BYTES * copies
    return Component("recurrent state", total,
                     f"{n_recurrent} layers x (conv {conv} + state {state}) x f32 x (1 + S={snapshots} snapshots)")


def weight_bytes(tensors: Iterable[TensorInfo]) -> tuple[int, str]:
    by_type: Counter[str] = Counter()
    for t in tensors:
        by_type[t.type_name] += t.nbytes
    detail = ", ".join(f"{name} {format_size(n)}" for name, n in by_type.most_common())
    return sum(by_type.values()), detail or "no tensors"


def _block_index(name: str) -> int | None:
    if name.startswith("blk."):
        return int(name.split(".")[1])
    return None


def target_weight_tensors(facts: ArtifactFacts, gpu_layers: int | None) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """(trunk tensors on the device, MTP block tensors), as llama.cpp places them.

    token_embd stays on the host (llama.cpp's input layer is always CPU) unless the
    model has no `output.weight` and ties its output projection to it. With
    gpu_layers = N, the last N trunk blocks are offloaded, and the output layer
    only when N exceeds the trunk's block count.
    """
    n_trunk = len(trunk_layers(facts))
    first_on_device = 0 if gpu_layers is None else max(n_trunk - gpu_layers, 0)
    output_on_device = gpu_layers is None or gpu_layers > n_trunk
    tied = not any(t.name == "output.weight" for t in facts.tensors)
    trunk, mtp = [], []
    for t in facts.tensors:
        block = _block_index(t.name)
        if block is None:
            if output_on_device and (t.name != "token_embd.weight" or tied):
                trunk.append(t)
        elif block >= n_trunk:
            mtp.append(t)
        elif block >= first_on_device:
            trunk.append(t)
    return trunk, mtp


def compute_component(facts: ArtifactFacts, rows: int, ctx: int, vocab: int, flash_attn: bool, label: str) -> Component:
    """The compute buffer of the worst-case graph at `rows` rows, every row an output (docs/sizing.md).

    Per row, f32: the logits over the vocabulary, four residual-width activations,
    three FFN-width activations (gate, up, their product) and, without flash
    attention, one score row per head over the cache.
    """
    n_embd = whole(facts.hparam("embedding_length"))
    n_ff = largest(facts.hparam("feed_forward_length"), 4 * n_embd)
    n_head = largest(facts.hparam("attention.head_count"), 1)
    cells = pad(ctx, KV_PAD)
    scores = 0 if flash_attn else n_head * cells
    per_row = vocab + 4 * n_embd + 3 * n_ff + scores
    return Component(f"{label} compute + logits", rows * per_row * 4,
                     f"{rows} rows x (vocab {vocab} + 4 x n_embd {n_embd} + 3 x n_ff {n_ff}"
                     + ("" if flash_attn else f" + n_head {n_head} x {cells} scores") + ") x f32")


def output_row_bytes(facts: ArtifactFacts, vocab: int) -> int:
    """Bytes of one row of the output projection (token_embd when tied)."""
    names = {t.name: t for t in facts.tensors}
    out = names.get("output.weight") or names.get("token_embd.weight")
    return out.nbytes // vocab if out is not None and vocab else 0


# --- the whole breakdown ----------------------------------------------------


def size_plan(target: ArtifactFacts, drafter: ArtifactFacts | None, request: Request, budget: Budget) -> Sizing:
    return Sizing(request.ctx, tuple(breakdown(target, drafter, request)), budget)


def breakdown(target: ArtifactFacts, drafter: ArtifactFacts | None, request: Request) -> list[Component]:
    trunk_tensors, mtp_tensors = target_weight_tensors(target, request.gpu_layers)
    total, detail = weight_bytes(trunk_tensors)
    components = [Component("target weights", total, detail)]
    layers = trunk_layers(target)
    if request.gpu_layers is not None and request.gpu_layers < len(layers):
        layers = layers[len(layers) - request.gpu_layers:]
    window = whole(target.hparam("attention.sliding_window")) or None
    components += kv_components(layers, request.ctx, window, request.kv_cache_type, "target KV")
    recurrent = recurrent_component(target, layers, request.snapshots)
    if recurrent is not None:
        components.append(recurrent)
    if request.use_mtp and mtp_tensors:
        mtp_total, mtp_detail = weight_bytes(mtp_tensors)
        components.append(Component("MTP head weights", mtp_total, mtp_detail))
        nextn = [layer for layer in target.layers if layer.kind == NEXTN]
        components += kv_components(nextn, request.ctx, None, request.kv_cache_type, "MTP head KV")
    if drafter is not None:
        drafter_total, drafter_detail = weight_bytes(drafter.tensors)
        components.append(Component("drafter weights", drafter_total, drafter_detail))
        components.append(drafter_kv_component(drafter, request.ctx, request.kv_cache_type))
    if request.fr_vocab_size:
        row = output_row_bytes(target, request.vocab)
        components.append(Component("FR projection", request.fr_vocab_size * row,
                                    f"{request.fr_vocab_size} rows x {row} B of the output matrix"))
    # The target's worst-case graph is a prefill micro-batch (llama.cpp reserves it with every row an output).
    target_rows = max(request.verify_rows, min(LLAMA_N_UBATCH, request.ctx))
    components.append(compute_component(target, target_rows, request.ctx, request.vocab, request.flash_attn, "target"))
    if drafter is not None:
        # A drafter runs one block at the verification shape and borrows the target's LM head (its vocabulary).
        components.append(compute_component(drafter, request.verify_rows, request.ctx, request.vocab, request.flash_attn,
                                            "drafter"))
    if request.use_mtp:
        # The MTP head drafts at the verification shape; FR cuts its logits to the first N token ids.
        components.append(compute_component(target, request.verify_rows, request.ctx,
                                            request.fr_vocab_size or request.vocab, request.flash_attn, "MTP head"))
    components.append(Component("CUDA context", CUDA_CONTEXT_BYTES, "CUDA runtime, cuBLAS workspace, kernel images"))
    if request.cuda_graphs:
        shapes = 2 if (drafter is not None or request.use_mtp) else 1
        components.append(Component("CUDA graphs", shapes * CUDA_GRAPH_BYTES_PER_SHAPE,
                                    f"{shapes} captured shape(s) x {CUDA_GRAPH_BYTES_PER_SHAPE // MiB} MiB pool"))
    return components


def drafter_kv_cells(drafter: ArtifactFacts, ctx: int) -> int:
    """The declared sliding window, else the whole target context (llama.cpp builds the draft context at n_ctx)."""
    return min(ctx, drafter.sliding_window) if drafter.sliding_window else ctx


def drafter_kv_component(drafter: ArtifactFacts, ctx: int, cache_type: str) -> Component:
    elements = drafter_kv_bytes_per_position(drafter, kv_type_size=1)
    per_position = type_bytes(elements, cache_type)
    cells = drafter_kv_cells(drafter, ctx)
    window = drafter.sliding_window
    why = f"sliding window {window}" if window else "no sliding window: the whole context"
    return Component("drafter KV", per_position * cells,
                     f"{format_size(per_position)} per position x {cells} cells ({why}) x {cache_type}")


def largest_context(target: ArtifactFacts, drafter: ArtifactFacts | None, request: Request, budget: Budget, limit: int) -> int | None:
    """The largest ctx up to `limit` whose plan fits under the headroom; None when not even ctx 1 does."""
    def fits(ctx: int) -> bool:
        return size_plan(target, drafter, replace(request, ctx=ctx), budget).margin_bytes >= 0

    if not fits(1):
        return None
    if fits(limit):
        return limit
    low, high = 1, limit  # fits(low), not fits(high): every component grows with ctx
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low
