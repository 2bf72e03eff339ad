"""Plans and memory breakdowns as text for people (the JSON/TOML documents are for machines)."""

from __future__ import annotations

from power.orchestrator.plan import Memory, ResolvedPlan
from power.orchestrator.units import format_size

VERDICTS = {
    "fits": "fits",
    "fits-below-headroom": "fits only below the headroom",
    "does-not-fit": "does not fit",
}


def memory_text(memory: Memory, device_name: str) -> str:
    width = max(len(c.name) for c in memory.components)
    lines = [f"  {c.name:<{width}}  {format_size(c.bytes):>11}  {c.detail}" for c in memory.components]
    lines.append(f"  {'total':<{width}}  {format_size(memory.total_bytes):>11}")
    lines.append(f"  {'headroom':<{width}}  {format_size(memory.headroom_bytes):>11}  kept free on the device")
    lines.append(f"  {'device':<{width}}  {format_size(memory.device_bytes):>11}  {device_name}")
    margin = f"margin {format_size(memory.margin_bytes)} after the headroom"
    largest = f"largest context that fits: {memory.max_ctx:,}" if memory.max_ctx else "no context fits"
    lines.append(f"  verdict at ctx {memory.ctx:,}: {VERDICTS[memory.verdict]} ({margin}); {largest}")
    return "\n".join(lines)


def summary_text(plan: ResolvedPlan) -> str:
    spec, mode, target = plan.speculation, plan.mode, plan.target
    lines = [
        f"plan {plan.name}  digest {plan.digest}",
        f"  target   {target.path} ({target.architecture}, {target.quant}, {target.n_layers} layers, "
        f"vocab {target.vocab_size:,}, sha256 {target.sha256[:16]}...)",
        f"  mode     {mode.resolved} (requested {mode.requested}: {mode.reason})"
        + (f"; chain {' -> '.join(mode.chain)}" if len(mode.chain) > 1 else ""),
    ]
    for drafter in plan.drafters:
        where = (f"{drafter.path} (sha256 {drafter.sha256[:16]}...)" if drafter.path and drafter.sha256
                 else "weight-free / in the target")
        lines.append(f"  drafter  {drafter.kind}: {where}")
    if spec.rollback != "none":
        rollback = {"full": "full rollback (S >= K)", "guarded": "guarded: one exact replay, then clamp to S"}[spec.rollback]
        lines.append(f"  K={spec.k} S={spec.s}  {rollback}; FR {spec.fr_vocab_size or 'off'}; "
                     f"adaptive {'on' if spec.adaptive else 'off'}")
    rt = plan.runtime
    lines.append(f"  runtime  ctx {rt.ctx:,}, slots {rt.slots}{' (unified KV)' if rt.kv_unified else ''}, "
                 f"batch {rt.batch}, verify capacity {rt.verify_capacity}, "
                 f"kv {rt.kv_cache_type}, cuda graphs {'on' if rt.cuda_graphs else 'off'}, "
                 f"sampling temperature {plan.sampling.temperature:g} seed {plan.sampling.seed} ({plan.sampling.verify})")
    if plan.tokenizer:
        tok = plan.tokenizer
        lines.append(f"  tokenizer {tok.model}/{tok.pre}, vocab {tok.vocab_size:,}, merges {tok.merges:,}, "
                     f"sha256 {tok.sha256[:16]}...")
    lines.append("  memory")
    lines.append(memory_text(plan.memory, plan.device.name))
    return "\n".join(lines)
