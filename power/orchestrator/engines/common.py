"""What more than one adapter says the same way: plan features without a flag, the device list, layer sharding,
the drafter's own placement."""

from __future__ import annotations

from power.documents.plan import ResolvedPlan
from power.orchestrator.engines.base import Asked, Refusal


def unsupported_notes(plan: ResolvedPlan) -> list[str]:
    """Plan settings no external engine has a flag for."""
    spec = plan.speculation
    notes = []
    if spec.rollback != "none" and plan.target.recurrent_layers:
        notes.append(f"S = {spec.s} recurrent snapshots ({spec.rollback} rollback): no flag; the engine keeps "
                     "its own rollback state")
    if spec.fr_vocab_size:
        notes.append(f"FR = {spec.fr_vocab_size} draft-only token-ID prefix: no flag; the draft head "
                     "projects the full vocabulary")
    if spec.adaptive:
        notes.append("adaptive K/S controller: no flag; the engine drafts a fixed K per round")
    notes.append(f"fixed verification capacity {plan.runtime.verify_capacity} rows: no flag")
    return notes


def visible_devices(plan: ResolvedPlan) -> dict[str, str]:
    """The host devices the plan was sized for, as the engine's CUDA device list (so it uses no other GPU);
    nothing for a plan on the host's first device alone."""
    indices = [d.index for d in plan.devices if d.kind == "gpu"]
    return {} if indices in ([], [0]) else {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in indices)}


def tensor_parallel_refusal(engine: str, asked: Asked) -> list[Refusal]:
    """tensor_parallel is vLLM's setting: an engine that does not shard layers refuses it."""
    if asked.tensor_parallel <= 1:
        return []
    return [Refusal("PWR510", f"runtime.tensor_parallel = {asked.tensor_parallel} is vLLM's setting; {engine} does "
                    "not shard layers", "remove tensor_parallel (llama-server splits layers by runtime.tensor_split), "
                    'or run engine "vllm"', "profile", "runtime.tensor_parallel")]


def draft_placement_refusal(engine: str, asked: Asked, kv_types: bool) -> list[Refusal]:
    """The drafter's own device or offloaded layers (and, for an engine that honours KV types, its own KV type) are
    llama-server's settings: an engine that runs the drafter with the target refuses them rather than dropping them.
    Power's runtime holds its MTP head's cache in the draft KV type itself (`kv_types` False: nothing to refuse)."""
    own_kv = kv_types and asked.draft_kv_cache_type not in (None, asked.kv_cache_type)
    if not (asked.draft_placed or own_kv):
        return []
    keys = [key for key, asked_for in (("draft_device / draft_gpu_layers", asked.draft_placed),
                                       ("draft_kv_cache_type", own_kv)) if asked_for]
    return [Refusal("PWR531", f"runtime.{' and '.join(keys)} place the drafter apart from the target; {engine} runs "
                    "the drafter with the target, on its devices and in its cache type", "remove "
                    f"runtime.{' and runtime.'.join(keys)}, or run this deployment with engine \"llama-server\"",
                    "profile", "runtime.draft_device" if asked.draft_placed else "runtime.draft_kv_cache_type")]
