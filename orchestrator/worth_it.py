"""Is a drafter worth it? The seeds' arithmetic, answered against the incumbent, not against zero.

    round_time = K * d_s + 1.1 * t_s        K drafts proposed, K + 1 verified in one target pass
    A          = (1 - p^(K+1)) / (1 - p)    expected tokens committed per round
    rate       = A / round_time

The incumbent may already speculate: its rate is what the operator sees, and its
commit per round turns that rate back into the target step
(t_s = commit_per_round / incumbent_rate) when no step time is given.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from power.orchestrator.plan import ResolvedPlan
from power.orchestrator.units import format_size

# One verification pass of K + 1 rows costs about 1.1 target steps (the seeds' figure).
VERIFY_COST = 1.1
BREAK_EVEN_DEPTHS = (1, 3, 7)


def round_time(k: int, draft_step: float, target_step: float) -> float:
    return k * draft_step + VERIFY_COST * target_step


def expected_accepted(p: float, k: int) -> float:
    """A: tokens committed per round when each position is accepted with probability p."""
    if p >= 1.0:
        return float(k + 1)
    return (1.0 - p ** (k + 1)) / (1.0 - p)


def rate(p: float, k: int, draft_step: float, target_step: float) -> float:
    return expected_accepted(p, k) / round_time(k, draft_step, target_step)


def break_even_p(k: int, draft_step: float, target_step: float, incumbent_rate: float) -> float | None:
    """The acceptance p at which the speculative rate equals the incumbent's; None when even p = 1 loses."""
    needed = incumbent_rate * round_time(k, draft_step, target_step)
    if expected_accepted(1.0, k) < needed:
        return None
    low, high = 0.0, 1.0
    for _ in range(60):  # A(p) is increasing in p: bisect
        mid = (low + high) / 2
        if expected_accepted(mid, k) < needed:
            low = mid
        else:
            high = mid
    return high


@dataclass(frozen=True)
class Report:
    target_step_s: float
    draft_step_s: float
    k: int
    incumbent_rate: float
    incumbent_commit: float
    target_already_drafts: bool
    break_even: dict[int, float | None]
    p_band: tuple[float, float]
    # (p, rate) at the band's low end, midpoint and high end
    band_rates: tuple[tuple[float, float], ...]
    verdict: str
    fit: str
    settling_measurement: str

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["break_even"] = {str(k): v for k, v in self.break_even.items()}
        return data


UNPLANNED_FIT = ("not checked: pass --plan PLAN (from `power plan MANIFEST PROFILE --device ...`) for the VRAM "
                 "verdict, the drafter's binding and tokenizer identity; the engine must accept an external drafter")


def fit_of(plan: ResolvedPlan) -> str:
    """Item 4 of the report from a compiled plan: the VRAM verdict and how the drafter attaches."""
    memory = plan.memory
    attach = (f"the drafter attaches as {' -> '.join(plan.mode.chain)} ({plan.mode.reason})" if plan.mode.chain
              else "no drafter attaches: the plan resolved to no speculation")
    devices = " + ".join(device.name for device in plan.devices)
    return (f"plan {plan.name}: {memory.verdict} on {devices} at ctx {memory.ctx:,} for {memory.engine} "
            f"(margin {format_size(memory.margin_bytes)}, largest context {memory.max_ctx or 0:,}); {attach}")


def assess(target_step: float, draft_step: float, k: int, incumbent_rate: float,
           incumbent_commit: float = 1.0, p_band: tuple[float, float] = (0.4, 0.6), fit: str = UNPLANNED_FIT) -> Report:
    depths = sorted({*BREAK_EVEN_DEPTHS, k})
    band = (p_band[0], (p_band[0] + p_band[1]) / 2, p_band[1])
    band_rates = tuple((p, rate(p, k, draft_step, target_step)) for p in band)
    low, high = band_rates[0][1], band_rates[-1][1]
    if low > incumbent_rate:
        verdict = "win"
    elif high < incumbent_rate:
        verdict = "loss"
    else:
        verdict = "depends on acceptance"
    return Report(
        target_step_s=target_step,
        draft_step_s=draft_step,
        k=k,
        incumbent_rate=incumbent_rate,
        incumbent_commit=incumbent_commit,
        target_already_drafts=incumbent_commit > 1.0,
        break_even={d: break_even_p(d, draft_step, target_step, incumbent_rate) for d in depths},
        p_band=p_band,
        band_rates=band_rates,
        verdict=verdict,
        fit=fit,
        settling_measurement=(
            "measure p on your traffic: greedy continuation agreement of drafter and target on identical "
            "prompts (temperature 0, same tokenizer), or a paired `power bench PLAN --vs PLAN2` run"
        ),
    )


def render_text(report: Report) -> str:
    """The report in the seeds' order: already drafting; break-even; band and rate; fit and attachment; the measurement."""
    r = report
    lines = [
        f"1. Does the target already draft? {'yes' if r.target_already_drafts else 'no'} "
        f"(incumbent {r.incumbent_rate:g} tok/s at {r.incumbent_commit:g} commit/round; "
        f"target step {r.target_step_s * 1000:.1f} ms, draft step {r.draft_step_s * 1000:.1f} ms)",
        "2. Break-even acceptance p against the incumbent:",
    ]
    for depth, p in r.break_even.items():
        shown = f"{p:.2f}" if p is not None else "none (loses even at p = 1)"
        lines.append(f"     K={depth}: {shown}")
    rates = ", ".join(f"{value:.1f} tok/s at p={p:g}" for p, value in r.band_rates)
    lines.append(f"3. At K={r.k} over the realistic band: {rates}; "
                 f"incumbent {r.incumbent_rate:g} tok/s -> {r.verdict.upper()}")
    lines.append(f"4. Fit and attachment surface: {r.fit}")
    lines.append(f"5. The one measurement that settles it: {r.settling_measurement}")
    return "\n".join(lines)
