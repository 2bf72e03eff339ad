"""PWR50x: the sizing verdict as findings, each saying what to change.

Located at the profile's `runtime.ctx`, the setting an operator usually turns.
"""

from __future__ import annotations

from power.artifacts.facts import ArtifactFacts
from power.findings import Finding
from power.orchestrator.loading import Loaded
from power.orchestrator.sizing import MiB, Sizing
from power.orchestrator.units import format_size

# Drafter KV above this without a sliding window is worth a warning (the seeds' DSpark: 5.0 GiB at 262144).
DRAFTER_KV_BUDGET = 1024 * MiB


def check_memory(profile: Loaded, sizing: Sizing, device_name: str, drafter: ArtifactFacts | None) -> list[Finding]:
    findings = []
    total, device, headroom = sizing.total_bytes, sizing.budget.device_bytes, sizing.budget.headroom_bytes
    if sizing.verdict == "does-not-fit":
        fix = (f"lower runtime.ctx to {sizing.max_ctx} or less" if sizing.max_ctx
               else "no context fits: use a smaller quant, fewer gpu_layers, or a larger device")
        findings.append(profile.finding(
            "PWR500", f"does not fit {device_name}: needs {format_size(total)} of {format_size(device)} "
            f"(over by {format_size(total - device)}; {format_size(headroom)} headroom on top)",
            where="runtime.ctx", hint=f"{fix} (`power size` shows every component)"))
    elif sizing.verdict == "fits-below-headroom":
        findings.append(profile.finding(
            "PWR501", f"fits {device_name} only by eating {format_size(-sizing.margin_bytes)} into the "
            f"{format_size(headroom)} headroom ({format_size(total)} of {format_size(device)})",
            where="runtime.ctx",
            hint=f"lower runtime.ctx to {sizing.max_ctx}" if sizing.max_ctx else "use a larger device"))
    elif sizing.thin:
        findings.append(profile.finding(
            "PWR503", f"fits {device_name} with a thin margin: {format_size(total)} of {format_size(device)}, "
            f"{format_size(sizing.margin_bytes)} left after the {format_size(headroom)} headroom: "
            "requires a quiet device (nothing else resident on it)", where="runtime.ctx"))
    if drafter is not None and drafter.sliding_window is None:
        findings += _unwindowed_drafter_kv(profile, sizing)
    return findings


def _unwindowed_drafter_kv(profile: Loaded, sizing: Sizing) -> list[Finding]:
    kv = next(c for c in sizing.components if c.name == "drafter KV")
    if kv.bytes <= DRAFTER_KV_BUDGET:
        return []
    return [profile.finding(
        "PWR502", f"the drafter declares no sliding window, so its KV caches the whole context: "
        f"{format_size(kv.bytes)} at ctx {sizing.ctx} ({kv.detail})", where="runtime.ctx",
        hint="lower runtime.ctx, or use a drafter that declares a sliding window")]
