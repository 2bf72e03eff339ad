"""What Power's own runtime (power.runtime) holds for a plan, on its one device (and, beside a GPU, on the host).

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
- vectors (norms, biases) and a depthwise convolution's taps in float32;
- where the runtime takes the exact greedy LM head (`power.documents.greedy_head`: a Q8_0 head on the CPU kernels,
  no final logit softcap, enough rows), the head is held once in the form its pass reads, a norm byte per row and
  bounded block more than its Q8_0 tiles, exactly (turned off at run time, `--greedy-head off`, the runtime holds
  that much less than the plan charges).

Attention caches hold their rows in the plan's KV type (`kv_cache_type`; the MTP head's
`draft_kv_cache_type`): f32, f16, bf16 or q8_0, each head's row of each position rounded
on write (`power.documents.kv_types`), so a row of width w costs ggml_row_size(type, w).
The recurrent state and a DFlash/DSpark drafter's ring are float32. The runtime's
layout differs from llama.cpp's:

- each slot gets ctx / slots positions, and every attention layer, sliding or
  global, keeps a region of `pad(ctx / slots + max(verify capacity, prefill
  chunk), 256)` positions per slot: `power.documents.geometry`, the function
  the runtime's `Engine` builds its trunk from;
- recurrent layers keep at most three states per slot (live, the last forward's
  start, the last whole prefill chunk's end) and, with S > 0, the last forward's
  inputs to the recurrence, from which a rewind replays (`runtime/trunks/qwen35.py`);
- the learned drafters run on the CPU and borrow the trunk's embedding and LM
  head: their matrices in GGUF blocks (`power.artifacts.contracts.drafter_tensor_role`),
  a block drafter's ring of its sliding window (else the whole context)
  (runtime/speculators/kv_ring.py); beside a GPU they are host memory;
- a forward runs at most the verification capacity's rows (the float32 reference
  pads every forward to it).

The KV regions and the weights follow the runtime's allocation rules; the recurrent
state is an upper bound; compute, the drafter ring and the CUDA terms are estimates
(torch's caching allocator and kernel workspaces are not modelled).
"""

from __future__ import annotations

from power.artifacts.contracts import PRODUCT, ROWS, drafter_tensor_role
from power.artifacts.facts import NEXTN, RECURRENT, ArtifactFacts, LayerFacts
from power.artifacts.gguf_reader import TensorInfo
from power.artifacts.runtime_types import RUNTIME_TYPES  # the types the CPU kernels multiply in place
from power.documents import greedy_head
from power.documents.arithmetic import QUANTISED
from power.documents.geometry import PREFILL_CHUNK, Geometry, runtime_geometry
from power.modes import NATIVE_HEADS
from power.orchestrator.engines.sizing.model import (
    CUDA_CONTEXT_BYTES,
    CUDA_GRAPH_BYTES_PER_SHAPE,
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
    recurrent_row_widths,
    trunk_layers,
    type_bytes,
    whole,
)

FLOAT32 = 4
EMBEDDING = "token_embd.weight"
OUTPUT = "output.weight"
FLOAT32_SUFFIXES = ("ssm_conv1d.weight",)  # 2-D, but a depthwise convolution's taps: held in float32
RECURRENT_STATES = 3  # a slot's live state, its last forward's start, its last whole prefill chunk's end
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
    greedy = _greedy_head(target, request.arithmetic, device.kind)
    if greedy is not None:
        components.append(greedy)
    attention = [l for l in trunk_layers(target) if l.kind != RECURRENT]
    if attention:
        components.append(_kv("target KV", attention, positions, request.slots, request.kv_cache_type))
    prefill_rows = max(request.verify_rows, min(PREFILL_CHUNK, layout.positions_per_slot))
    recurrent = _recurrent(target, request, prefill_rows)
    if recurrent is not None:
        components.append(recurrent)
    # The learned drafters run on the CPU (their bits shape proposals, never tokens): on a GPU their weights, caches
    # and compute are host memory, outside the device's verdict.
    drafting: list[Component] = []
    if request.use_mtp:
        mtp = _mtp_head(target)
        if mtp:
            drafting.append(_quantised_weights("MTP head weights", mtp))
            drafting.append(_kv("MTP head KV", [l for l in target.layers if l.kind == NEXTN], positions,
                                request.slots, request.draft_kv_cache_type))
    if drafter is not None:
        if drafter.drafter_kind in NATIVE_HEADS:
            drafting.append(_quantised_weights("drafter weights", _mtp_head(drafter)))
        else:
            drafting.append(_block_drafter_weights(list(drafter.tensors)))
        drafting.append(_drafter_ring(drafter, request))
    if request.fr_vocab_size:
        components.append(_cut_head(target, request.fr_vocab_size, device.kind))
    components.append(_compute(target, prefill_rows, positions, request.vocab, request.flash_attn, "target"))
    if (
        drafter is not None and drafter.drafter_kind not in NATIVE_HEADS
    ):  # an MTP sidecar's compute is the MTP head's, below
        drafting.append(_compute(drafter, request.verify_rows, positions, request.vocab, request.flash_attn, "drafter"))
    if request.use_mtp:
        drafting.append(_compute(target, request.verify_rows, positions, request.fr_vocab_size or request.vocab,
                                 request.flash_attn, "MTP head"))
    host = tuple(c for c in drafting if c.bytes) if device.kind == "gpu" else ()
    if not host:
        components += drafting
    if device.kind == "gpu":
        components.append(Component("CUDA context", CUDA_CONTEXT_BYTES, "CUDA runtime, cuBLAS workspace, kernel images "
                                    "(not measured here)", "estimated"))
        if request.cuda_graphs:
            shapes = 2 if (drafter is not None or request.use_mtp) else 1
            components.append(Component("CUDA graphs", shapes * CUDA_GRAPH_BYTES_PER_SHAPE,
                                        f"{shapes} captured shape(s) x {CUDA_GRAPH_BYTES_PER_SHAPE // MiB} MiB pool "
                                        "(not measured here)", "estimated"))
    slots = SlotFacts(slots=request.slots, kv_unified=False, engine_ctx=layout.positions_per_slot * request.slots,
                      ctx_per_slot=layout.positions_per_slot, kv_streams=request.slots, sliding_cells=None,
                      batch=request.verify_rows,
                      ubatch=request.verify_rows, outputs=request.verify_rows)
    placed = DeviceSizing(device, tuple(c for c in components if c.bytes), "every layer")
    return Sizing("power", request.ctx, slots, (placed,), host)


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


def _mtp_head(facts: ArtifactFacts) -> list[TensorInfo]:
    """The nextn block's tensors: what the MTP head loads (from the target, or from an MTP-only sidecar)."""
    return [t for t in facts.tensors if _mtp_tensor(t, facts)]


def _quantised_weights(name: str, tensors: list[TensorInfo]) -> Component:
    """The MTP head's weights, on the CPU: matrices in their GGUF blocks in the kernels' tiles, vectors in f32
    (`power.runtime.speculators.mtp.MTPHead.weight_bytes`)."""
    held = sum(held_bytes(t, QUANTISED, "cpu", tied=False) for t in tensors)
    return Component(name, held, f"{len(tensors)} tensors on the CPU: matrices as their GGUF blocks in 16-row tiles, "
                     "vectors in f32")


def _cut_head(target: ArtifactFacts, rows: int, device_kind: str) -> Component:
    """An FR draft head: the first `rows` rows of the target's LM head in their GGUF blocks on the trunk's device
    (`power.runtime.speculators.target_head`); the whole head is the trunk's own."""
    head = _lm_head(target)
    width, vocab = head.dims
    row = head.nbytes // vocab
    if device_kind == "cpu":
        held, how = pad(rows, TILE) * row, "GGUF blocks in 16-row tiles"
    elif head.type_name in BLOCK_TYPES:
        held, how = rows * row, "GGUF rows"
    else:
        held, how = rows * width * FLOAT32, "f32"
    return Component("FR projection", held, f"{rows} rows of the LM head ({head.type_name}) x n_embd {width} as {how}")


def _lm_head(target: ArtifactFacts) -> TensorInfo:
    """`output.weight`, or the token embedding the output is tied to."""
    return next(t for t in target.tensors if t.name == (OUTPUT if any(t.name == OUTPUT for t in target.tensors)
                                                         else EMBEDDING))


def _greedy_head(target: ArtifactFacts, arithmetic: str, device_kind: str) -> Component | None:
    """What holding the LM head once for the exact greedy head costs beyond its Q8_0 tiles, where the runtime takes
    it (None elsewhere)."""
    head = _lm_head(target)
    width, vocab = head.dims
    softcap = target.hparam("final_logit_softcapping")
    if greedy_head.refusal(head.type_name, vocab, softcap, arithmetic == QUANTISED and device_kind == "cpu"):
        return None
    exact = greedy_head.exact_blocks(width)
    return Component("greedy LM head", greedy_head.held_once_extra_bytes(vocab, width),
                     f"the {head.type_name} LM head held once for greedy rows: per 16-row tile {exact} of "
                     f"{width // greedy_head.BLOCK} blocks of 32 as Q8_0, the rest as high and low nibbles apart, with "
                     f"a norm byte per row (docs/runtime.md, \"The exact greedy LM head\")")


def _block_drafter_weights(tensors: list[TensorInfo]) -> Component:
    """A DFlash / DSpark drafter's weights as its loader holds them (`power.artifacts.contracts.drafter_tensor_role`):
    the matrices that multiply activations in their GGUF blocks in the CPU kernels' tiles, a token-indexed table as
    its GGUF rows, the rest in float32."""
    held = sum(_drafter_tensor_bytes(t) for t in tensors)
    products = sum(1 for t in tensors if drafter_tensor_role(t.name) == PRODUCT)
    return Component("drafter weights", held, f"{len(tensors)} tensors on the CPU: {products} matrices as their GGUF "
                     "blocks in 16-row tiles, token-indexed tables as their GGUF rows, the rest in f32")


def _drafter_tensor_bytes(tensor: TensorInfo) -> int:
    role = drafter_tensor_role(tensor.name)
    if role == PRODUCT and tensor.type_name in RUNTIME_TYPES:
        return held_bytes(tensor, QUANTISED, "cpu", tied=False)
    return tensor.nbytes if role == ROWS else _elements(tensor) * FLOAT32


def _elements(tensor: TensorInfo) -> int:
    count = 1
    for dim in tensor.dims:
        count *= dim
    return count


def _kv(name: str, layers: list[LayerFacts], positions: int, slots: int, kv_type: str) -> Component:
    """Each head's key and value rows of each position, rounded to `kv_type` row by row (ggml_row_size)."""
    per_position = sum(l.n_head_kv * (type_bytes(l.head_dim_k, kv_type) + type_bytes(l.head_dim_v, kv_type))
                       for l in layers)
    heads = "/".join(str(h) for h in sorted({l.n_head_kv for l in layers}))
    sample = layers[0]
    return Component(name, per_position * positions * slots,
                     f"{len(layers)} layers (sliding ones too) x n_head_kv {heads} x (k {sample.head_dim_k} + "
                     f"v {sample.head_dim_v}) x {positions} positions x {slots} slot(s) x {kv_type}")


def _recurrent(facts: ArtifactFacts, request: Request, rows: int) -> Component | None:
    """Per slot: three states at most (the live one, the one its last forward started from, the one at its last whole
    prefill chunk's end; copies share a state's tensors), and with S > 0 each layer's inputs to the recurrence for the
    last forward's rows (at most `rows`), from which a rewind replays (`power.runtime.trunks.qwen35`)."""
    count = sum(1 for layer in trunk_layers(facts) if layer.kind == RECURRENT)
    if not count:
        return None
    conv, state = recurrent_row_widths(facts)
    channels = conv // max(whole(facts.hparam("ssm.conv_kernel")) - 1, 1)
    heads = whole(facts.hparam("ssm.time_step_rank"))
    inputs = rows * (channels + 2 * heads) if request.snapshots else 0
    held = count * (RECURRENT_STATES * (conv + state) + inputs) * FLOAT32 * request.slots
    replay = (f" + {rows} rows x (qkv {channels} + decay and beta 2 x {heads}) of replay inputs"
              if request.snapshots else "")
    return Component("recurrent state", held, f"{count} layers x ({RECURRENT_STATES} states x (conv {conv} + state "
                     f"{state}){replay}) x f32 x {request.slots} slot(s), for S = {request.snapshots}", "estimated")


def _drafter_ring(drafter: ArtifactFacts, request: Request) -> Component:
    window = drafter.sliding_window
    context = geometry(request).positions_per_slot
    rows = min(context, window) if window else context
    # An MTP-only sidecar's header counts its trunk's blocks too; only its nextn blocks hold a cache.
    cached = [l for l in drafter.layers if l.kind == NEXTN] if drafter.drafter_kind in NATIVE_HEADS else drafter.layers
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
