"""Whether a bench's configurations can be resident on the device together: the plans' own sizing, summed.

Each plan says what it needs on each device it uses (`memory.devices`); the
configurations a bench runs side by side need the sum. When that sum is over
what the device offers below its headroom (a 27B target and its incumbent on
one 24 GB card), or when the operator asks (`--one-at-a-time`), the bench runs
them in turn (`power.app.bench.harness.run_in_turns`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from power.documents.plan import ResolvedPlan
from power.orchestrator.inputs.units import format_size

SIDE_BY_SIDE, SEQUENTIAL = "side-by-side", "sequential"


@dataclass(frozen=True)
class Residency:
    protocol: str  # SIDE_BY_SIDE | SEQUENTIAL
    reason: str

    @property
    def sequential(self) -> bool:
        return self.protocol == SEQUENTIAL


def residency(plans: list[ResolvedPlan], asked: bool = False, in_turns: bool = True) -> Residency:
    """Side by side when every device holds the configurations' summed needs below its headroom; else in turn.
    `in_turns`: the engine can run them in turn (a live server per configuration; Power's runtime loads every plan
    in the bench's own process, so there the sums are reported and the run stays side by side)."""
    devices = _summed(plans)
    over = [d for d in devices if d["need_bytes"] > d["usable_bytes"]]
    sums = "; ".join(f"device {d['index']} ({d['name']}): {format_size(d['need_bytes'])} needed together, "
                     f"{format_size(d['usable_bytes'])} usable below the headroom" for d in devices)
    if over and not in_turns:
        return Residency(SIDE_BY_SIDE, f"side by side in this process, though the plans' sizing does not fit the "
                                       f"device together ({sums})")
    if over:
        return Residency(SEQUENTIAL, f"the {len(plans)} configurations cannot be resident together ({sums}): "
                                     "one at a time")
    if asked:
        return Residency(SEQUENTIAL, f"one at a time, as asked (--one-at-a-time; {sums})")
    return Residency(SIDE_BY_SIDE, f"the {len(plans)} configurations fit together ({sums})")


def _summed(plans: list[ResolvedPlan]) -> list[dict[str, Any]]:
    """Per device index the first plan places there (the device the bench measures on): the plans' needs summed."""
    first = {device.index: device for device in plans[0].memory.devices}
    return [{"index": index, "name": device.name,
             "need_bytes": sum(d.total_bytes for plan in plans for d in plan.memory.devices if d.index == index),
             "usable_bytes": device.device_bytes - device.headroom_bytes}
            for index, device in sorted(first.items())]
