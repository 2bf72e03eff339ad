"""Plans and memory breakdowns as text for people (the JSON/TOML documents are for machines)."""

from __future__ import annotations

from power.documents.plan import Memory, MemoryComponent, ResolvedPlan
from power.orchestrator.inputs.units import format_size

VERDICTS = {
    "fits": "fits",
    "fits-below-headroom": "fits only below the headroom",
    "does-not-fit": "does not fit",
}


def memory_text(memory: Memory) -> str:
    """The breakdown device by device: each component with its basis (exact to the engine, estimated, measured)."""
    named = [c.name for device in memory.devices for c in device.components] + [c.name for c in memory.host]
    width = max(len(name) for name in [*named, "headroom"])
    lines = [f"  sized for {memory.engine}: {_slots_text(memory)}"]
    for device in memory.devices:
        lines.append(f"  device {device.index}: {device.name}, {format_size(device.device_bytes)}; {device.holds}")
        lines += [_component_line(c, width) for c in device.components]
        lines.append(f"    {'total':<{width}}  {format_size(device.total_bytes):>11}")
        lines.append(f"    {'headroom':<{width}}  {format_size(device.headroom_bytes):>11}  kept free on the device")
        lines.append(f"    {VERDICTS[device.verdict]} (margin {format_size(device.margin_bytes)} after the headroom)")
    if memory.host:
        lines.append("  host memory (no verdict: the host's RAM)")
        lines += [_component_line(c, width) for c in memory.host]
    largest = f"largest context that fits: {memory.max_ctx:,}" if memory.max_ctx else "no context fits"
    lines.append(f"  verdict at ctx {memory.ctx:,}: {VERDICTS[memory.verdict]} (smallest margin "
                 f"{format_size(memory.margin_bytes)}); {largest}")
    estimated = sorted({c.name for d in memory.devices for c in d.components if c.basis == "estimated"})
    if estimated:
        lines.append(f"  estimated, not exact to the engine: {', '.join(estimated)}")
    return "\n".join(lines)


def _component_line(component: MemoryComponent, width: int) -> str:
    return (
        f"    {component.name:<{width}}  {format_size(component.bytes):>11}  {component.basis:<9}  {component.detail}"
    )


def _slots_text(memory: Memory) -> str:
    slots = memory.slots
    kv = (f"one KV cache of {slots.ctx_per_slot:,} cells shared" if slots.kv_unified else
          f"{slots.ctx_per_slot:,} KV cells each ({slots.kv_streams} stream(s))")
    sliding = f", sliding-window cache {slots.sliding_cells:,} cells per stream" if slots.sliding_cells else ""
    return (f"{slots.slots} slot(s), {kv}{sliding}; engine context {slots.engine_ctx:,}; batch {slots.batch}, "
            f"micro-batch {slots.ubatch}, {slots.outputs} output row(s) per decode")


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
        rollback = {"full": "full rollback (S >= K)",
                    "guarded": "guarded: one exact replay, then clamp to S"}[spec.rollback]
        lines.append(f"  K={spec.k} S={spec.s}  {rollback}; FR {spec.fr_vocab_size or 'off'}; "
                     f"adaptive {'on' if spec.adaptive else 'off'}")
    rt = plan.runtime
    split = ""
    if len(plan.devices) > 1:
        split = (f", tensor parallel {rt.tensor_parallel}" if rt.tensor_parallel > 1 else
                 f", split {rt.split_mode} {list(rt.tensor_split or ())} main {rt.main_gpu}")
    if rt.draft_device is not None or rt.draft_gpu_layers != "all":
        split += (f"; drafter on {rt.draft_device or 'the target devices'}, "
                  f"{rt.draft_gpu_layers if rt.draft_gpu_layers != 'all' else 'all'} layer(s) offloaded")
    lines.append(f"  devices  {', '.join(f'{d.index}: {d.name}' for d in plan.devices)}{split}")
    lines.append(f"  runtime  ctx {rt.ctx:,}, slots {rt.slots}{' (unified KV)' if rt.kv_unified else ''}, "
                 f"batch {rt.batch}, verify capacity {rt.verify_capacity}, "
                 f"kv {rt.kv_cache_type}, cuda graphs {'on' if rt.cuda_graphs else 'off'}, "
                 f"sampling temperature {plan.sampling.temperature:g} seed {plan.sampling.seed} "
                 f"({plan.sampling.verify})")
    if plan.tokenizer:
        tok = plan.tokenizer
        lines.append(f"  tokenizer {tok.model}/{tok.pre}, vocab {tok.vocab_size:,}, merges {tok.merges:,}, "
                     f"sha256 {tok.sha256[:16]}...")
    lines.append("  memory")
    lines.append(memory_text(plan.memory))
    return "\n".join(lines)
