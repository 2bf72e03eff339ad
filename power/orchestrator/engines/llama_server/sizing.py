"""What llama-server allocates for a plan, device by device (llama.cpp as vendored in llama-cpp-python 0.3.36).

Per device (placement: `power.orchestrator.engines.llama_server.placement`):

- target weights: the tensors of the blocks placed there, and the output layer
  (`output_norm`, `output`) where it is placed; the input layer (`token_embd`)
  stays in host memory, and a model without `output.weight` loads a duplicate of
  `token_embd` as its output on the output layer's device
  (`llama_model_base::load_tensors`, TENSOR_DUPLICATED);
- target KV: per attention layer on that device, K `[n_head_kv x head_dim_k,
  cells, streams]` and V likewise in the cache type (without flash attention V is
  stored transposed and padded to the largest layer's width,
  `n_embd_v_gqa_max`); global layers keep n_ctx_seq cells per stream, sliding
  layers `llama_context.sliding_cells` (src/llama-kv-cache.cpp);
- recurrent state: per delta-net/SSM layer, conv `n_embd_r` and state `n_embd_s`
  f32 rows for max(1, n_seq_max) x (1 + n_rs_seq) rows
  (src/llama-memory-recurrent.cpp, llama_hparams::n_embd_r / n_embd_s);
- the compute buffer of the reserved graph (`llama_graph`); on a GPU each device
  of a layer split reserves its own, and the host a small one for the graph
  inputs;
- the draft context of a drafter or MTP head: its weights, KV, output and
  compute (common/speculative.cpp);
- CUDA context and graph pools: documented estimates.

The output buffer (`llama_context::output_reserve`: n_vocab x max(n_outputs,
n_seq_max) f32) is host memory on a GPU (the output device's host buffer type);
it grows from n_seq_max rows at load to n_outputs_max rows on the first decode
that returns that many (a verification of every slot's draft).

A CPU device runs everything in host memory: every tensor (mmap'ed), the CPU
repack copies, KV, output and one compute buffer.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from power.artifacts.facts import GLOBAL, NEXTN, RECURRENT, SLIDING, ArtifactFacts, LayerFacts
from power.artifacts.gguf_reader import TensorInfo
from power.orchestrator.engines.llama_server.context import LlamaContext, draft_context, slot_facts, target_context
from power.orchestrator.engines.llama_server.placement import LayerPlacement, place_layers
from power.orchestrator.engines.sizing import llama_graph
from power.orchestrator.engines.sizing.model import (
    CUDA_CONTEXT_BYTES,
    CUDA_GRAPH_BYTES_PER_SHAPE,
    Basis,
    Component,
    DeviceBudget,
    DeviceSizing,
    MiB,
    Request,
    Sizing,
    Split,
    block_index,
    is_quantized,
    largest,
    recurrent_row_widths,
    type_bytes,
    whole,
)
from power.orchestrator.inputs.units import format_size

# Recurrent conv and ssm state are f32 (type_r, type_s).
STATE_BYTES = 4
INPUT_TENSORS = frozenset({"token_embd.weight", "token_types.weight", "position_embd.weight"})
# x86-64 AVX2 builds repack these matrices into interleaved copies (ggml-cpu/repack.cpp,
# ggml_repack_get_optimal_repack_type) when their row count is a multiple of 8; `--no-repack` turns it off.
AVX2_REPACK_TYPES = frozenset({"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"})
REPACK_ROWS = 8

HOST = None  # location key of host memory


@dataclass
class _Ledger:
    """Components by location (a device position, or HOST)."""

    by_location: dict[int | None, list[Component]]

    def add(self, where: int | None, component: Component) -> None:
        if component.bytes:
            self.by_location[where].append(component)


def size_llama_server(target: ArtifactFacts, drafter: ArtifactFacts | None, request: Request,
                      devices: tuple[DeviceBudget, ...]) -> Sizing:
    context = target_context(request, target.architecture)
    placement = place_layers(len(target.layers), request.gpu_layers, devices, request.split)
    on_cpu = devices[0].kind == "cpu"
    ledger = _Ledger(defaultdict(list))
    _weights(ledger, target, placement, "target weights", on_cpu, request.use_mtp)
    _kv(ledger, target, [l for l in target.layers if l.kind in (GLOBAL, SLIDING)], placement, context,
        request.kv_cache_type, "target KV", "exact")
    _recurrent(ledger, target, placement, context)
    output_at = 0 if on_cpu else HOST
    _output_buffer(ledger, output_at, request.vocab, context, "")
    _compute(ledger, target, placement, context, request, devices, "target compute buffer", estimated=False)
    if on_cpu:
        ledger.add(0, _repack(target.tensors))
    if drafter is not None:
        _draft_model(ledger, drafter, request, context, devices)
    elif request.use_mtp:
        _mtp_context(ledger, target, placement, request, context, devices)
    for position in _initialised_gpus(devices, request):
        runs_layers = bool(ledger.by_location[position])
        ledger.add(position, Component("CUDA context", CUDA_CONTEXT_BYTES,
                                       "CUDA runtime, cuBLAS workspace, kernel images (not measured here)",
                                       "estimated"))
        if request.cuda_graphs and runs_layers:
            shapes = 2 if (drafter is not None or request.use_mtp) else 1
            ledger.add(position, Component("CUDA graphs", shapes * CUDA_GRAPH_BYTES_PER_SHAPE,
                                           f"{shapes} captured graph(s) x {CUDA_GRAPH_BYTES_PER_SHAPE // MiB} MiB pool "
                                           "(not measured here)", "estimated"))
    sized = tuple(DeviceSizing(device, tuple(ledger.by_location[position]), placement.describe(position))
                  for position, device in enumerate(devices))
    n_swa = whole(target.hparam("attention.sliding_window")) or None
    return Sizing("llama-server", request.ctx, slot_facts(context, n_swa), sized, tuple(ledger.by_location[HOST]))


def _initialised_gpus(devices: tuple[DeviceBudget, ...], request: Request) -> list[int]:
    """Every device of a layer split gets a backend (and a CUDA context); `-sm none` keeps the main one only, and
    the drafter's own devices."""
    if devices[0].kind == "cpu":
        return []
    if request.split.mode == "layer":
        return list(range(len(devices)))
    drafter = {request.draft_device} | {where for _, where in request.draft_overrides}
    return sorted({request.split.main} | {position for position in drafter if position is not None})


# --- weights ---------------------------------------------------------------------


def _tensor_location(tensor: TensorInfo, placement: LayerPlacement, input_at: int | None) -> int | None:
    block = block_index(tensor.name)
    if block is not None:
        return placement.layers[block]
    if tensor.name in INPUT_TENSORS:
        return input_at
    return placement.output


def _weights(ledger: _Ledger, facts: ArtifactFacts, placement: LayerPlacement, name: str, on_cpu: bool,
             load_mtp: bool = False, overrides: tuple[tuple[str, int | None], ...] = ()) -> None:
    """The tensors llama.cpp loads, where it places them. MTP (nextn) blocks load only with draft-mtp
    (`llama_model_params.load_mtp`, common/common.cpp; the architecture's loader marks them TENSOR_SKIP otherwise)."""
    input_at = 0 if on_cpu else HOST
    nextn = sum(1 for layer in facts.layers if layer.kind == NEXTN)
    by_location: dict[int | None, list[TensorInfo]] = defaultdict(list)
    for tensor in facts.tensors:
        if load_mtp or not _in_nextn_block(tensor, facts, nextn):
            by_location[_overridden(tensor, overrides, on_cpu, _tensor_location(tensor, placement, input_at))].append(
                tensor)
    tied = "output.weight" not in {t.name for t in facts.tensors}
    embedding = next((t for t in facts.tensors if t.name == "token_embd.weight"), None)
    if tied and embedding is not None and placement.output != input_at:
        by_location[placement.output].append(embedding)
    for where, tensors in by_location.items():
        detail = _by_type(tensors)
        if where == input_at and not on_cpu:
            detail += "; the input layer (token_embd) and any layer not offloaded, mmap'ed"
        if tied and embedding is not None and where == placement.output and not on_cpu:
            detail += "; with a duplicate of token_embd as the tied output"
        if any(_in_nextn_block(t, facts, nextn) for t in tensors):
            detail += f"; with the {nextn} MTP block(s) draft-mtp loads"
        ledger.add(where, Component(name, sum(t.nbytes for t in tensors), detail))


def _overridden(tensor: TensorInfo, overrides: tuple[tuple[str, int | None], ...], on_cpu: bool,
                placed: int | None) -> int | None:
    """Where an override puts the tensor (llama.cpp searches each pattern in the name, the first match wins; CPU is
    host memory), else where its layer put it. On a CPU device everything is host memory already."""
    if on_cpu:
        return placed
    return next((where for pattern, where in overrides if re.search(pattern, tensor.name)), placed)


def _in_nextn_block(tensor: TensorInfo, facts: ArtifactFacts, nextn: int) -> bool:
    block = block_index(tensor.name)
    return nextn > 0 and block is not None and block >= len(facts.layers) - nextn


def _by_type(tensors: list[TensorInfo]) -> str:
    totals: dict[str, int] = defaultdict(int)
    for tensor in tensors:
        totals[tensor.type_name] += tensor.nbytes
    ranked = sorted(totals.items(), key=lambda item: -item[1])
    return ", ".join(f"{name} {format_size(n)}" for name, n in ranked) or "no tensors"


def _repack(tensors: tuple[TensorInfo, ...]) -> Component:
    """The CPU_REPACK buffer: an interleaved copy of each matrix an x86 AVX2 build repacks (kept besides the mmap)."""
    chosen = [t for t in tensors if t.type_name in AVX2_REPACK_TYPES and len(t.dims) == 2
              and t.dims[1] % REPACK_ROWS == 0 and t.name not in INPUT_TENSORS]
    return Component("CPU repack", sum(t.nbytes for t in chosen),
                     f"{len(chosen)} {'/'.join(sorted({t.type_name for t in chosen})) or 'no'} matrices repacked "
                     "for an x86 AVX2 CPU (other CPUs repack other types; --no-repack: none)", "estimated")


# --- KV and recurrent state ------------------------------------------------------


def kv_cell_bytes(layer: LayerFacts, k_type: str, v_type: str, v_width: int) -> int:
    """One cell of one layer: K row n_head_kv x head_dim_k plus V row `v_width` (ggml_row_size of each)."""
    return type_bytes(layer.n_head_kv * layer.head_dim_k, k_type) + type_bytes(v_width, v_type)


def _kv(ledger: _Ledger, facts: ArtifactFacts, layers: list[LayerFacts], placement: LayerPlacement,
        context: LlamaContext,
        cache_type: str, label: str, basis: Basis) -> None:
    n_swa = whole(facts.hparam("attention.sliding_window"))
    v_widest = max((l.n_head_kv * l.head_dim_v for l in layers), default=0)
    groups: dict[tuple[int | None, str], list[LayerFacts]] = defaultdict(list)
    for layer in layers:
        groups[(placement.layers[layer.index], layer.kind)].append(layer)
    for (where, kind), members in groups.items():
        cells = context.sliding_cells(n_swa) if kind == SLIDING and n_swa else context.n_ctx_seq
        total = 0
        for layer in members:
            v_width = layer.n_head_kv * layer.head_dim_v if context.flash_attn else v_widest
            total += kv_cell_bytes(layer, cache_type, cache_type, v_width) * cells * context.n_stream
        heads = "/".join(str(h) for h in sorted({l.n_head_kv for l in members}))
        sample = members[0]
        padded = not context.flash_attn and any(l.n_head_kv * l.head_dim_v < v_widest for l in members)
        v_note = " (V transposed, padded to the widest layer)" if padded else ""
        ledger.add(where, Component(
            label if kind == NEXTN else f"{label} ({kind})", total,
            f"{len(members)} layers x n_head_kv {heads} x (k {sample.head_dim_k} + v {sample.head_dim_v}){v_note} x "
            f"{cells} cells x {context.n_stream} stream(s) x {cache_type}", basis))


def _recurrent(ledger: _Ledger, facts: ArtifactFacts, placement: LayerPlacement, context: LlamaContext) -> None:
    layers = [l for l in facts.layers if l.kind == RECURRENT]
    if not layers:
        return
    conv, state = recurrent_row_widths(facts)
    rows = max(1, context.n_seq_max) * (1 + context.n_rs_seq)
    groups: dict[int | None, int] = defaultdict(int)
    for layer in layers:
        groups[placement.layers[layer.index]] += 1
    for where, count in groups.items():
        ledger.add(where, Component("recurrent state", count * (conv + state) * STATE_BYTES * rows,
                                    f"{count} layers x (conv {conv} + state {state}) x f32 x {rows} row(s): "
                                    f"{context.n_seq_max} sequence(s) x (1 + {context.n_rs_seq} rollback rows)"))


# --- output and compute ----------------------------------------------------------


def _output_buffer(ledger: _Ledger, where: int | None, vocab: int, context: LlamaContext, prefix: str) -> None:
    at_load = context.n_seq_max
    ledger.add(where, Component(f"{prefix}output buffer", vocab * 4 * at_load,
                                f"{at_load} row(s) x vocab {vocab} x f32 (one per sequence, at load)"))
    grown = max(context.n_outputs_max, at_load) - at_load
    ledger.add(where, Component(f"{prefix}output buffer growth", vocab * 4 * grown,
                                f"{grown} more rows x vocab {vocab} x f32: {context.n_outputs_max} rows once a decode "
                                f"verifies every slot's draft ({context.n_seq_max} x (1 + draft))"))


def graph_shape(facts: ArtifactFacts, context: LlamaContext, vocab: int, cache_type: str,
                layers: list[LayerFacts] | None = None) -> llama_graph.GraphShape:
    layers = [l for l in facts.layers if l.kind in (GLOBAL, SLIDING)] if layers is None else layers
    n_swa = whole(facts.hparam("attention.sliding_window"))
    kinds = sorted({l.kind for l in layers})
    cells = tuple(context.sliding_cells(n_swa) if kind == SLIDING and n_swa else context.n_ctx_seq for kind in kinds)
    sample = layers[0] if layers else None
    n_embd = whole(facts.hparam("embedding_length"))
    return llama_graph.GraphShape(
        architecture=facts.architecture, n_embd=n_embd,
        n_head=largest(facts.hparam("attention.head_count"), 1),
        n_head_kv=max((l.n_head_kv for l in layers), default=0),
        head_dim_k=sample.head_dim_k if sample else 0, head_dim_v=sample.head_dim_v if sample else 0,
        n_ff=largest(facts.hparam("feed_forward_length"), 4 * n_embd), n_vocab=vocab, cache_cells=cells,
        tokens=context.reserve_tokens(), outputs=context.reserve_outputs(), sequences=context.n_seq_max,
        flash_attn=context.flash_attn, quantized_kv=is_quantized(cache_type))


def _compute(ledger: _Ledger, facts: ArtifactFacts, placement: LayerPlacement, context: LlamaContext, request: Request,
             devices: tuple[DeviceBudget, ...], name: str, estimated: bool, vocab: int | None = None,
             cache_type: str | None = None) -> None:
    shape = graph_shape(facts, context, request.vocab if vocab is None else vocab, cache_type or request.kv_cache_type)
    why = "" if shape.modelled else f" ({facts.architecture}: the dense form, not checked for this architecture)"
    if devices[0].kind == "cpu":
        size, peak = llama_graph.compute_bytes(shape, llama_graph.CPU_ALIGNMENT)
        ledger.add(0, Component(name, size, f"peak at {peak.name}: {peak.terms}{why}",
                                "estimated" if estimated or not shape.modelled else "exact"))
        return
    for position in range(len(devices)):
        has_layers, has_output = bool(placement.layers_on(position)), placement.output == position
        if has_layers or has_output:
            size, peak = llama_graph.compute_bytes(shape, llama_graph.CUDA_ALIGNMENT, has_layers, has_output)
            ledger.add(position, Component(name, size, f"peak at {peak.name}: {peak.terms} (the CPU-checked form at "
                                                       "CUDA's 128 B alignment; not measured on a GPU)", "estimated"))
    host_layers = placement.layers_on(HOST)
    if host_layers:
        size, peak = llama_graph.compute_bytes(shape, llama_graph.CPU_ALIGNMENT, True, placement.output is HOST)
        ledger.add(HOST, Component(f"{name} (host)", size, f"the layers kept on the CPU, peak at {peak.name}: "
                                                           f"{peak.terms}", "estimated"))
    else:
        inputs, terms = llama_graph.input_bytes(shape, llama_graph.CPU_ALIGNMENT)
        ledger.add(HOST, Component(f"{name} (host)", inputs,
                                   f"the graph inputs, set on the CPU backend before the copy to the devices: {terms}",
                                   "estimated"))


# --- draft contexts ----------------------------------------------------------------


def _draft_model(ledger: _Ledger, drafter: ArtifactFacts, request: Request, target: LlamaContext,
                 devices: tuple[DeviceBudget, ...]) -> None:
    """A drafter GGUF with its own llama_context (common_speculative_init_result): placed like the target,
    KV in the draft cache type over the draft context's cells, its own output and compute buffers."""
    context = draft_context(request, target)
    placement = _draft_placement(len(drafter.layers), request, devices)
    on_cpu = devices[0].kind == "cpu"
    _weights(ledger, drafter, placement, "drafter weights", on_cpu, overrides=request.draft_overrides)
    _kv(ledger, drafter, [l for l in drafter.layers if l.kind in (GLOBAL, SLIDING)], placement, context,
        request.draft_kv_cache_type, "drafter KV", "estimated")
    vocab = (drafter.tokenizer.vocab_size if drafter.tokenizer else 0) or request.vocab
    _output_buffer(ledger, 0 if on_cpu else HOST, vocab, context, "drafter ")
    _compute(ledger, drafter, placement, context, request, devices, "drafter compute buffer", estimated=True,
             vocab=vocab, cache_type=request.draft_kv_cache_type)


def _draft_placement(n_layers: int, request: Request, devices: tuple[DeviceBudget, ...]) -> LayerPlacement:
    """The drafter's layers as llama.cpp places its model (common/speculative.cpp gives it the target's split
    settings with its own device list and --spec-draft-ngl): on its own device when --spec-draft-device names one,
    else split over the target's devices."""
    if request.draft_device is None or devices[0].kind == "cpu":
        return place_layers(n_layers, request.draft_gpu_layers, devices, request.split)
    own = place_layers(n_layers, request.draft_gpu_layers, (devices[request.draft_device],), Split())
    return LayerPlacement(tuple(None if where is None else request.draft_device for where in own.layers),
                     None if own.output is None else request.draft_device)


def _mtp_context(ledger: _Ledger, target: ArtifactFacts, placement: LayerPlacement, request: Request,
                 target_context_: LlamaContext, devices: tuple[DeviceBudget, ...]) -> None:
    """draft-mtp: a second llama_context on the target's own weights (ctx_type MTP) whose KV holds only the nextn
    layers (llama_model::create_memory: `il >= n_layer`); its graph (the MTP head) is estimated."""
    context = draft_context(request, target_context_)
    nextn = [l for l in target.layers if l.kind == NEXTN]
    _kv(ledger, target, nextn, placement, context, request.draft_kv_cache_type, "MTP KV", "exact")
    on_cpu = devices[0].kind == "cpu"
    _output_buffer(ledger, 0 if on_cpu else HOST, request.vocab, context, "MTP ")
    mtp_layers = [LayerFacts(l.index, GLOBAL, l.n_head_kv, l.head_dim_k, l.head_dim_v, l.tensor_count, l.nbytes)
                  for l in nextn]
    shape = graph_shape(target, context, request.vocab, request.draft_kv_cache_type, mtp_layers)
    where = 0 if on_cpu else placement.layers[nextn[0].index] if nextn else placement.output
    cpu = on_cpu or where is HOST
    alignment = llama_graph.CPU_ALIGNMENT if cpu else llama_graph.CUDA_ALIGNMENT
    modelled = target.architecture in llama_graph.HYBRID_ARCHITECTURES and len(nextn) == 1
    phases = llama_graph.mtp_phases(shape, alignment) if modelled else llama_graph.compute_phases(shape, alignment)
    peak = max(phases, key=lambda phase: phase.bytes)
    why = "" if modelled else " (the trunk's one-block form: this architecture's MTP graph is not modelled)"
    gpu = "" if cpu else " (at CUDA's 128 B alignment; not measured on a GPU)"
    ledger.add(where, Component("MTP compute buffer", peak.bytes, f"peak at {peak.name}: {peak.terms}{why}{gpu}",
                                "exact" if modelled and cpu else "estimated"))
