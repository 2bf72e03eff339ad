"""PWR50x: the sizing verdict as findings, one per device that needs one, each saying what to change.

Located at the profile setting an operator turns: a layer split that fits is
proposed first (runtime.tensor_split), a smaller context after it (runtime.ctx).
"""

from __future__ import annotations

from power.artifacts.facts import ArtifactFacts
from power.findings import Finding
from power.orchestrator.engines import adapter
from power.orchestrator.engines.sizing import DeviceSizing, MiB, Sizing
from power.orchestrator.inputs.loading import Loaded
from power.orchestrator.inputs.units import format_size

# Drafter KV above this without a sliding window is worth a warning (docs/reference.md: DSpark's 5.0 GiB at 262144).
DRAFTER_KV_BUDGET = 1024 * MiB


def check_memory(profile: Loaded, sizing: Sizing, drafter: ArtifactFacts | None) -> list[Finding]:
    findings = []
    several = len(sizing.devices) > 1
    for device in sizing.devices:
        label = f"device {device.device.index} ({device.device.name})" if several else device.device.name
        findings += _device_findings(profile, sizing, device, label)
    if drafter is not None and drafter.sliding_window is None:
        findings += _unwindowed_drafter_kv(profile, sizing)
    return findings


def _device_findings(profile: Loaded, sizing: Sizing, device: DeviceSizing, label: str) -> list[Finding]:
    total, memory, headroom = device.total_bytes, device.device.memory_bytes, device.device.headroom_bytes
    if device.verdict == "does-not-fit":
        where, fix = _fix(sizing)
        engine = adapter(sizing.engine)
        return [profile.finding(
            "PWR500", f"does not fit {label} on {engine.description}: needs {format_size(total)} of "
            f"{format_size(memory)} (over by {format_size(total - memory)}; {format_size(headroom)} headroom on top)",
            where=where, hint=f"{fix} (`power size --engine {engine.name}` shows every component; each engine "
                              "allocates differently: `--engine`, or a deployment's `engine`, picks another)")]
    if device.verdict == "fits-below-headroom":
        where, fix = _fix(sizing)
        return [profile.finding(
            "PWR501", f"fits {label} only by eating {format_size(-device.margin_bytes)} into the "
            f"{format_size(headroom)} headroom ({format_size(total)} of {format_size(memory)})", where=where,
            hint=fix if sizing.max_ctx or sizing.fitting_split else "use a larger device")]
    if device.thin:
        return [profile.finding(
            "PWR503", f"fits {label} with a thin margin: {format_size(total)} of {format_size(memory)}, "
            f"{format_size(device.margin_bytes)} left after the {format_size(headroom)} headroom: "
            "requires a quiet device (nothing else resident on it)", where="runtime.ctx")]
    return []


def _fix(sizing: Sizing) -> tuple[str, str]:
    """The first change that fits: a layer split at the same context, else the largest context that fits."""
    if sizing.fitting_split is not None:
        counts = sizing.fitting_split
        ratios = ", ".join(str(c) for c in counts)
        return "runtime.tensor_split", (f"set runtime.tensor_split = [{ratios}] (layers per device, the output layer "
                                        f"counted last) to fit at ctx {sizing.ctx:,}")
    if sizing.max_ctx:
        return "runtime.ctx", f"lower runtime.ctx to {sizing.max_ctx} or less"
    return "runtime.ctx", "no context fits: use a smaller quant, fewer gpu_layers, more devices or a larger device"


def _unwindowed_drafter_kv(profile: Loaded, sizing: Sizing) -> list[Finding]:
    kv = [c for c in sizing.components + sizing.host if c.name.startswith("drafter KV")]
    total = sum(c.bytes for c in kv)
    if total <= DRAFTER_KV_BUDGET:
        return []
    return [profile.finding(
        "PWR502", f"the drafter declares no sliding window, so its KV caches the whole context: "
        f"{format_size(total)} at ctx {sizing.ctx} ({kv[0].detail})", where="runtime.ctx",
        hint="lower runtime.ctx, or use a drafter that declares a sliding window")]
