"""What Power's own runtime (power.runtime) holds for a plan, on its one device.

The target's weights are what the loader holds (`power.runtime.trunks.base.Weights`;
tests/test_sizing.py compares the two on Gemma and the fixtures), which follows the
plan's arithmetic (power.documents.arithmetic):

- the token embedding stays in its GGUF rows (a lookup dequantises the rows it
  needs); tied to the LM head, it holds nothing of its own and reads the head's
  rows (`power.runtime.embedding`), so the head is its one copy;
- quantised on the CPU: every matrix as its GGUF blocks in the kernels' tile
  layout (`power.kernels.cpu.QuantMatrix`: the file's bytes, output rows padded
  to whole tiles of 16), the LM head too; on a GPU, every matrix of a type the
  Triton product reads as its GGUF rows;
- float32: every matrix dequantised, 4 B a weight;
- vectors (norms, biases) and a depthwise convolution's taps in float32.

Every cache is float32. The runtime's layout differs from llama.cpp's:

- each slot gets ctx / slots positions, and every attention layer, sliding or
  global, keeps a region of `pad(ctx / slots + max(verify capacity, prefill
  chunk), 256)` positions per slot: `power.documents.geometry`, the function
  the runtime's `Engine` builds its trunk from;
- recurrent layers keep their conv and delta state and S snapshots per slot;
- a drafter keeps a ring of its sliding window (else the whole context)
  (runtime/speculators/kv_ring.py);
- a forward runs at most the verification capacity's rows (the float32 reference
  pads every forward to it).

The KV regions and the target's weights follow the runtime's allocation rules;
compute, drafters and the CUDA terms are estimates (torch's caching allocator and
kernel workspaces are not modelled).
"""

from __future__ import annotations

from power.artifacts.contracts import MTP
from power.artifacts.facts import NEXTN, RECURRENT, ArtifactFacts, LayerFacts
from power.artifacts.gguf_reader import TensorInfo
from power.documents.arithmetic import QUANTISED
from power.documents.geometry import PREFILL_CHUNK, Geometry, runtime_geometry
from power.orchestrator.sizing.llama_server import CUDA_CONTEXT_BYTES, CUDA_GRAPH_BYTES_PER_SHAPE, recurrent_row_widths
from power.orchestrator.sizing.model import (
    Component,
    DeviceBudget,
    DeviceSizing,
    MiB,
    Request,
    Sizing,
    SlotFacts,
    block_index,
    largest,
    pad,
    trunk_layers,
    whole,
)

FLOAT32 = 4
EMBEDDING = "token_embd.weight"
OUTPUT = "output.weight"
FLOAT32_SUFFIXES = ("ssm_conv1d.weight",)  # 2-D, but a depthwise convolution's taps: held in float32
TILE = 16  # output rows per tile of the CPU kernels' layout (power/kernels/cpu/layout.py TILE)
# The types the GPU's batch-invariant product reads in place (power/kernels/dequant.py TRITON_TYPES).
BLOCK_TYPES = ("Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


def geometry(request: Request) -> Geometry:
    """The runtime's own layout of the request (the function `Engine` builds its trunk from)."""
    return runtime_geometry(request.ctx, request.slots, request.verify_rows)


def size_power(target: ArtifactFacts, drafter: ArtifactFacts | None, request: Request,
               devices: tuple[DeviceBudget, ...]) -> Sizing:
    device = devices[0]
    layout = geometry(request)
    positions = layout.allocated_positions
    trunk_tensors = [t for t in target.tensors if not _mtp_tensor(t, target)]
    components = [_target_weights(trunk_tensors, request.arithmetic, device.kind)]
    attention = [l for l in trunk_layers(target) if l.kind != RECURRENT]
    if attention:
        components.append(_kv("target KV", attention, positions, request.slots))
    recurrent = _recurrent(target, request)
    if recurrent is not None:
        components.append(recurrent)
    if request.use_mtp:
        mtp = [t for t in target.tensors if _mtp_tensor(t, target)]
        if mtp:
            components.append(_weights("MTP head weights", mtp))
            components.append(_kv("MTP head KV", [l for l in target.layers if l.kind == NEXTN], positions,
                                  request.slots))
    if drafter is not None:
        components.append(_weights("drafter weights", list(drafter.tensors)))
        components.append(_drafter_ring(drafter, request))
    if request.fr_vocab_size:
        width = whole(target.hparam("embedding_length"))
        components.append(Component("FR projection", request.fr_vocab_size * width * FLOAT32,
                                    f"{request.fr_vocab_size} rows x n_embd {width} x f32 of the output matrix",
                                    "estimated"))
    prefill_rows = max(request.verify_rows, min(PREFILL_CHUNK, layout.positions_per_slot))
    components.append(_compute(target, prefill_rows, positions, request.vocab, request.flash_attn, "target"))
    if drafter is not None and drafter.drafter_kind != MTP:  # an MTP sidecar's compute is the MTP head's, below
        components.append(_compute(drafter, request.verify_rows, positions, request.vocab, request.flash_attn, "drafter"))
    if request.use_mtp:
        components.append(_compute(target, request.verify_rows, positions, request.fr_vocab_size or request.vocab,
                                   request.flash_attn, "MTP head"))
    if device.kind == "gpu":
        components.append(Component("CUDA context", CUDA_CONTEXT_BYTES, "CUDA runtime, cuBLAS workspace, kernel images "
                                    "(not measured here)", "estimated"))
        if request.cuda_graphs:
            shapes = 2 if (drafter is not None or request.use_mtp) else 1
            components.append(Component("CUDA graphs", shapes * CUDA_GRAPH_BYTES_PER_SHAPE,
                                        f"{shapes} captured shape(s) x {CUDA_GRAPH_BYTES_PER_SHAPE // MiB} MiB pool "
                                        "(not measured here)", "estimated"))
    slots = SlotFacts(slots=request.slots, kv_unified=False, engine_ctx=layout.positions_per_slot * request.slots,
                      ctx_per_slot=layout.positions_per_slot, kv_streams=request.slots, sliding_cells=None, batch=request.verify_rows,
                      ubatch=request.verify_rows, outputs=request.verify_rows)
    placed = DeviceSizing(device, tuple(c for c in components if c.bytes), "every layer")
    return Sizing("power", request.ctx, slots, (placed,))


def _mtp_tensor(tensor: TensorInfo, facts: ArtifactFacts) -> bool:
    block = block_index(tensor.name)
    return block is not None and block < len(facts.layers) and facts.layers[block].kind == NEXTN


def _target_weights(tensors: list[TensorInfo], arithmetic: str, device_kind: str) -> Component:
    """What the loader holds for the trunk's tensors (and the LM head)."""
    tied = not any(t.name == OUTPUT for t in tensors)
    held = sum(held_bytes(t, arithmetic, device_kind, tied) for t in tensors)
    if arithmetic != QUANTISED:
        how = "f32"
    else:
        how = "their GGUF blocks in 16-row tiles" if device_kind == "cpu" else "their GGUF rows"
    embedding = "read from the tied LM head" if tied else "as its GGUF rows"
    return Component("target weights", held, f"{len(tensors)} tensors in the {arithmetic} arithmetic: the embedding "
                     f"{embedding}, matrices and the LM head as {how}, vectors in f32")


def held_bytes(tensor: TensorInfo, arithmetic: str, device_kind: str, tied: bool) -> int:
    """One tensor as the runtime's loader holds it; `tied`: the embedding is the LM head too (held as the head)."""
    if tensor.name == EMBEDDING:
        return _matrix_bytes(tensor, arithmetic, device_kind) if tied else tensor.nbytes
    if len(tensor.dims) == 2 and not tensor.name.endswith(FLOAT32_SUFFIXES):
        return _matrix_bytes(tensor, arithmetic, device_kind)
    return _elements(tensor) * FLOAT32


def _matrix_bytes(tensor: TensorInfo, arithmetic: str, device_kind: str) -> int:
    in_features, out_features = tensor.dims
    if arithmetic != QUANTISED:
        return in_features * out_features * FLOAT32
    if device_kind == "cpu":
        return pad(out_features, TILE) * (tensor.nbytes // out_features)
    return tensor.nbytes if tensor.type_name in BLOCK_TYPES else in_features * out_features * FLOAT32


def _weights(name: str, tensors: list[TensorInfo]) -> Component:
    """A drafter's (or the MTP head's) weights: its loader dequantises them to float32."""
    elements = sum(_elements(t) for t in tensors)
    return Component(name, elements * FLOAT32, f"{elements:,} elements x f32 (drafters dequantise their weights)",
                     "estimated")


def _elements(tensor: TensorInfo) -> int:
    count = 1
    for dim in tensor.dims:
        count *= dim
    return count


def _kv(name: str, layers: list[LayerFacts], positions: int, slots: int) -> Component:
    per_position = sum(l.n_head_kv * (l.head_dim_k + l.head_dim_v) for l in layers) * FLOAT32
    heads = "/".join(str(h) for h in sorted({l.n_head_kv for l in layers}))
    sample = layers[0]
    return Component(name, per_position * positions * slots,
                     f"{len(layers)} layers (sliding ones too) x n_head_kv {heads} x (k {sample.head_dim_k} + "
                     f"v {sample.head_dim_v}) x {positions} positions x {slots} slot(s) x f32")


def _recurrent(facts: ArtifactFacts, request: Request) -> Component | None:
    count = sum(1 for layer in trunk_layers(facts) if layer.kind == RECURRENT)
    if not count:
        return None
    conv, state = recurrent_row_widths(facts)
    copies = (1 + request.snapshots) * request.slots
    return Component("recurrent state", count * (conv + state) * FLOAT32 * copies,
                     f"{count} layers x (conv {conv} + state {state}) x f32 x (1 + S={request.snapshots} snapshots) x "
                     f"{request.slots} slot(s)", "estimated")


def _drafter_ring(drafter: ArtifactFacts, request: Request) -> Component:
    window = drafter.sliding_window
    context = geometry(request).positions_per_slot
    rows = min(context, window) if window else context
    # An MTP-only sidecar's header counts its trunk's blocks too; only its nextn blocks hold a cache.
    cached = [l for l in drafter.layers if l.kind == NEXTN] if drafter.drafter_kind == MTP else drafter.layers
    per_position = sum(l.n_head_kv * (l.head_dim_k + l.head_dim_v) for l in cached) * FLOAT32
    why = f"sliding window {window}" if window else "no sliding window: the slot's whole context"
    return Component("drafter KV", per_position * rows * request.slots,
                     f"{per_position:,} B per position x {rows} rows ({why}) x {request.slots} slot(s) x f32",
                     "estimated")


def _compute(facts: ArtifactFacts, rows: int, positions: int, vocab: int, flash_attn: bool, label: str) -> Component:
    """Activations and logits of one forward at `rows` rows, every row an output: per row the logits, four
    residual-width and three FFN-width activations, and without flash attention one score row per head."""
    n_embd = whole(facts.hparam("embedding_length"))
    n_ff = largest(facts.hparam("feed_forward_length"), 4 * n_embd)
    n_head = largest(facts.hparam("attention.head_count"), 1)
    scores = 0 if flash_attn else n_head * positions
    per_row = vocab + 4 * n_embd + 3 * n_ff + scores
    return Component(f"{label} compute + logits", rows * per_row * FLOAT32,
                     f"{rows} rows x (vocab {vocab} + 4 x n_embd {n_embd} + 3 x n_ff {n_ff}"
                     + ("" if flash_attn else f" + n_head {n_head} x {positions} scores") + ") x f32", "estimated")
