"""What vLLM holds per GPU under tensor parallelism: an estimate, labelled as one.

With `--tensor-parallel-size TP` every layer is sharded across the TP devices:
each holds 1/TP of the weight matrices, n_head/TP query heads and
n_head_kv/TP KV heads (or one replicated KV head when TP exceeds the KV heads,
vllm/model_executor/models/llama.py `LlamaAttention`), so each device's KV is
1/TP of the whole (at least one head). vLLM sizes its KV pool from
`--gpu-memory-utilization`; the plan charges what `--max-num-seqs` sequences of
`--max-model-len` tokens need (16-token blocks), which is what must fit.
Heads that do not divide are refused before sizing (`tensor_parallel_issue`).
A drafter given as a checkpoint (DFlash, DSpark, EAGLE-3) adds its weights and
its own layers' KV for the same sequences, sharded the same way (vLLM's draft
model runs with the target's tensor parallelism unless told otherwise).
"""

from __future__ import annotations

from power.artifacts.facts import GLOBAL, RECURRENT, SLIDING, ArtifactFacts
from power.orchestrator.engines.sizing import llama_graph
from power.orchestrator.engines.sizing.model import (
    CUDA_CONTEXT_BYTES,
    CUDA_GRAPH_BYTES_PER_SHAPE,
    CheckpointDraft,
    Component,
    DeviceBudget,
    DeviceSizing,
    MiB,
    Request,
    Sizing,
    SlotFacts,
    largest,
    pad,
    recurrent_row_widths,
    trunk_layers,
    whole,
)

# vLLM's KV block (--block-size default 16) and its cache element for "auto" (the model dtype, 16-bit).
BLOCK_TOKENS = 16
KV_ELEMENT = 2


def tensor_parallel_issue(facts: ArtifactFacts, tp: int) -> str | None:
    """Why `tp` cannot shard this model's heads (vLLM asserts these at load), or None."""
    if tp <= 1:
        return None
    heads = largest(facts.hparam("attention.head_count"), 0)
    kv_heads = max((l.n_head_kv for l in facts.layers if l.kind in (GLOBAL, SLIDING)), default=0)
    if heads % tp:
        return f"{heads} attention heads do not divide by tensor_parallel {tp}"
    if kv_heads and (kv_heads % tp if kv_heads >= tp else tp % kv_heads):
        return (f"{kv_heads} KV heads and tensor_parallel {tp}: vLLM needs the KV heads to divide by it "
                "(or it to divide by the KV heads, which are then replicated)")
    for key, what in (("ssm.group_count", "delta-net key heads"), ("ssm.time_step_rank", "delta-net value heads")):
        count = whole(facts.hparam(key))
        if count and count % tp:
            return f"{count} {what} do not divide by tensor_parallel {tp}"
    return None


def size_vllm(target: ArtifactFacts, request: Request, devices: tuple[DeviceBudget, ...]) -> Sizing:
    tp = max(1, request.split.tensor_parallel)
    weights = sum(t.nbytes for t in target.tensors)
    tokens = pad(request.ctx, BLOCK_TOKENS)
    n_swa = whole(target.hparam("attention.sliding_window"))
    kv = 0
    for layer in trunk_layers(target):
        if layer.kind in (GLOBAL, SLIDING):
            heads = max(1, layer.n_head_kv // tp)
            cells = min(tokens, pad(n_swa, BLOCK_TOKENS) + BLOCK_TOKENS) if layer.kind == SLIDING and n_swa else tokens
            kv += heads * (layer.head_dim_k + layer.head_dim_v) * KV_ELEMENT * cells * request.slots
    recurrent_layers = sum(1 for layer in trunk_layers(target) if layer.kind == RECURRENT)
    conv, state = recurrent_row_widths(target) if recurrent_layers else (0, 0)
    n_embd = whole(target.hparam("embedding_length"))
    shape = llama_graph.GraphShape(
        architecture=target.architecture, n_embd=n_embd,
        n_head=largest(target.hparam("attention.head_count"), 1) // tp,
        n_head_kv=1, head_dim_k=0, head_dim_v=0,
        n_ff=largest(target.hparam("feed_forward_length"), 4 * n_embd) // tp, n_vocab=request.vocab // tp,
        cache_cells=(), tokens=min(request.batch, tokens), outputs=request.slots, sequences=request.slots,
        flash_attn=True)
    activations, peak = llama_graph.compute_bytes(shape, llama_graph.CUDA_ALIGNMENT)
    sized = []
    for device in devices[:tp]:
        components = [
            Component("target weights", weights // tp, f"1/{tp} of {weights:,} B of tensors (matrices sharded; "
                                                       "embeddings vocab-parallel)", "estimated"),
            Component("target KV", kv, f"{request.slots} sequence(s) x {tokens} tokens in {BLOCK_TOKENS}-token blocks, "
                                       f"1/{tp} of the KV heads per device, 16-bit", "estimated"),
            Component("recurrent state", recurrent_layers * (conv + state) * 4 * request.slots // tp,
                      f"{recurrent_layers} layers x (conv {conv} + state {state}) x f32 x {request.slots} sequence(s) "
                      f"/ {tp}", "estimated"),
            Component("activations", activations, f"one step of {shape.tokens} tokens with 1/{tp} of the heads, FFN "
                                                  f"and vocabulary, peak at {peak.name}", "estimated"),
            Component("CUDA context", CUDA_CONTEXT_BYTES, "CUDA runtime, NCCL, kernel images (not measured here)",
                      "estimated"),
        ]
        if request.checkpoint_draft is not None:
            components += _draft_components(request.checkpoint_draft, tp, tokens, request.slots)
        if request.cuda_graphs:
            components.append(Component("CUDA graphs", CUDA_GRAPH_BYTES_PER_SHAPE,
                                        f"{CUDA_GRAPH_BYTES_PER_SHAPE // MiB} MiB graph pool (not measured here)",
                                        "estimated"))
        sized.append(DeviceSizing(device, tuple(c for c in components if c.bytes), f"1/{tp} of every layer"))
    slots = SlotFacts(slots=request.slots, kv_unified=True, engine_ctx=tokens * request.slots, ctx_per_slot=tokens,
                      kv_streams=1, sliding_cells=None, batch=request.batch, ubatch=request.batch,
                      outputs=request.slots)
    return Sizing("vllm", request.ctx, slots, tuple(sized))


def _draft_components(draft: CheckpointDraft, tp: int, tokens: int, slots: int) -> list[Component]:
    heads = max(1, draft.kv_heads // tp)
    kv = draft.layers * heads * draft.head_dim * 2 * KV_ELEMENT * tokens * slots
    return [
        Component("drafter weights", draft.weights_bytes // tp, f"1/{tp} of {draft.weights_bytes:,} B of the "
                                                                "checkpoint's safetensors files", "estimated"),
        Component("drafter KV", kv, f"{draft.layers} layer(s) x {heads} KV head(s) x {draft.head_dim} x K and V, "
                                    f"{slots} sequence(s) x {tokens} tokens, 16-bit", "estimated"),
    ]
