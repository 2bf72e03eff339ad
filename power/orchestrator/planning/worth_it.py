"""Is a drafter worth it? The break-even arithmetic (docs/reference.md), answered against the
incumbent, not against zero.

    round_time = draft_cost(K, d_s) + v * t_s      drafting, then K + 1 rows verified in one target pass
    A          = (1 - p^(K+1)) / (1 - p)           expected tokens committed per round
    rate       = A / round_time

One verification pass of K + 1 rows costs v target steps: about 1.1 on the GPU
engines the arithmetic was written for (`VERIFY_COST`), more where the extra rows
are not free (a CPU multiplies 8 rows in more time than one): `--verify-cost`,
or measured (`bench/bench_drafter.py` reports each configuration's).

What one round of drafting costs depends on the drafter's kind (step
3, `power.modes` draft_cost): a plain model runs K sequential forwards (K x d_s),
a trained head (MTP, DFlash, DSpark) about one pass whatever K (d_s), a weight-free
n-gram lookup nothing. Charging a trained head K x d_s would overcharge it about
K times.

The incumbent may already speculate: its rate is what the operator sees, and its
commit per round turns that rate back into the target step
(t_s = commit_per_round / incumbent_rate) when no step time is given. With a
`power bench` evidence file the step times come from the engine's own timings
instead of a guess (`steps_from_evidence`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from power import modes
from power.documents.evidence import BASELINE, CANDIDATE
from power.documents.plan import ResolvedPlan
from power.documents.verdicts import NOISE_BAND
from power.orchestrator.inputs.units import format_size

# One verification pass of K + 1 rows costs about 1.1 target steps on a GPU engine (docs/reference.md).
VERIFY_COST = 1.1
BREAK_EVEN_DEPTHS = (1, 3, 7)
# Steps 1 and 4 (docs/reference.md): what engines report about themselves runs optimistic.
OPTIMISM_WARNING = ("acceptance and decode rates an engine reports about itself run optimistic (engine-internal "
                    "decode-only numbers ~1.7-2x the rate clients see): price with the rate the operator sees, and "
                    "treat 40-60 % as the honest acceptance band for a matched pair")


def draft_time(kind_cost: modes.DraftCost, k: int, draft_step: float) -> float:
    """What drafting K proposals costs per round, by the drafter's kind."""
    return {"per-token": k * draft_step, "per-round": draft_step, "none": 0.0}[kind_cost]


def cost_of(drafter: str) -> modes.DraftCost:
    return modes.mode(drafter).draft_cost


def round_time(k: int, draft_step: float, target_step: float, drafter: str = modes.DRAFT_MODEL,
               verify_cost: float = VERIFY_COST) -> float:
    return draft_time(cost_of(drafter), k, draft_step) + verify_cost * target_step


def expected_accepted(p: float, k: int) -> float:
    """A: tokens committed per round when each position is accepted with probability p."""
    if p >= 1.0:
        return float(k + 1)
    return (1.0 - p ** (k + 1)) / (1.0 - p)


def acceptance_of(commit_per_round: float, k: int) -> float:
    """The per-position acceptance p at which A(p, K) equals a measured commit per round (inverse of A)."""
    return 1.0 if commit_per_round >= k + 1 else _p_reaching(commit_per_round, k)


def _p_reaching(commit_per_round: float, k: int) -> float:
    """The least p (to 60 halvings) with A(p, K) >= commit_per_round; A is increasing in p, so bisect."""
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if expected_accepted(mid, k) < commit_per_round else (low, mid)
    return high


def rate(p: float, k: int, draft_step: float, target_step: float, drafter: str = modes.DRAFT_MODEL,
         verify_cost: float = VERIFY_COST) -> float:
    return expected_accepted(p, k) / round_time(k, draft_step, target_step, drafter, verify_cost)


def break_even_p(k: int, draft_step: float, target_step: float, incumbent_rate: float,
                 drafter: str = modes.DRAFT_MODEL, verify_cost: float = VERIFY_COST) -> float | None:
    """The acceptance p at which the speculative rate equals the incumbent's; None when even p = 1 loses."""
    needed = incumbent_rate * round_time(k, draft_step, target_step, drafter, verify_cost)
    return None if expected_accepted(1.0, k) < needed else _p_reaching(needed, k)


@dataclass(frozen=True)
class MeasuredSteps:
    """Step times read from a `power bench` evidence file: the engine's own timings on one traffic shape."""

    engine: str
    shape: str
    target_step: float  # t_s: the baseline's decode time per round over its commit per round
    draft_step: float  # d_s: what the candidate's round costs beyond verification, per drafter step
    incumbent_rate: float  # the baseline's decode tok/s
    incumbent_commit: float  # the baseline's tokens per round
    drafter: str
    k: int
    measured_p: float | None  # the candidate's per-position acceptance implied by its commit per round

    def document(self) -> dict[str, Any]:
        return asdict(self)


def steps_from_evidence(evidence: dict[str, Any], shape: str | None = None,
                        verify_cost: float = VERIFY_COST) -> MeasuredSteps:
    """t_s and d_s from a bench's paired runs (ValueError naming what is missing when the evidence cannot say)."""
    shapes = evidence.get("shapes") or {}
    name = shape or ("prose" if "prose" in shapes else next(iter(shapes), None))
    if name not in shapes:
        raise ValueError(f"the evidence has no {name!r} shape (it has: {', '.join(shapes) or 'none'})")
    result, candidate = shapes[name], evidence.get(CANDIDATE) or {}
    if not evidence.get(BASELINE) or BASELINE not in result:
        raise ValueError("the evidence has no baseline (--vs): t_s comes from the baseline's own steps")
    base, cand = result[BASELINE], result[CANDIDATE]
    if base["decode_tok_s"] <= 0 or cand["decode_tok_s"] <= 0:
        raise ValueError(f"on {name!r} a configuration decoded nothing after its first token")
    base_commit, cand_commit = max(1.0, base["tokens_per_round"]), max(1.0, cand["tokens_per_round"])
    target_step = base_commit / base["decode_tok_s"]  # step 1: 1 / (rate / commit per round)
    drafter, k = str(candidate.get("mode", modes.NONE)), int(candidate.get("k", 0))
    if drafter == modes.NONE or k < 1:
        raise ValueError("the evidence's candidate does not speculate: nothing to price")
    cand_round = cand_commit / cand["decode_tok_s"]
    per_round = draft_time(cost_of(drafter), k, 1.0)
    draft_step = max(0.0, (cand_round - verify_cost * target_step) / per_round) if per_round else 0.0
    measured_p = acceptance_of(cand_commit, k) if cand.get("draft_n") else None
    engine = str((evidence.get("engine") or {}).get("name", "power"))
    return MeasuredSteps(engine, str(name), target_step, draft_step, base["decode_tok_s"], base_commit, drafter, k,
                         measured_p)


@dataclass(frozen=True)
class Report:
    target_step_s: float
    draft_step_s: float
    k: int
    drafter: str
    draft_cost: str
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
    verify_cost: float = VERIFY_COST  # target steps one verification pass of K + 1 rows costs
    warning: str = OPTIMISM_WARNING
    measured: dict[str, Any] | None = None  # the evidence the steps were read from, when they were
    # --slots N: the candidate's measured aggregate speedup with N clients at once (`under_load`)
    load: dict[str, Any] | None = None

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
           incumbent_commit: float = 1.0, p_band: tuple[float, float] = (0.4, 0.6), fit: str = UNPLANNED_FIT,
           drafter: str = modes.DRAFT_MODEL, measured: MeasuredSteps | None = None,
           verify_cost: float = VERIFY_COST, load: dict[str, Any] | None = None) -> Report:
    """`load`: `under_load`'s reading at the deployment's slots; a candidate that does not pay there is a loss,
    whatever the single-stream arithmetic says."""
    depths = sorted({*BREAK_EVEN_DEPTHS, k})
    band = (p_band[0], (p_band[0] + p_band[1]) / 2, p_band[1])
    band_rates = tuple((p, rate(p, k, draft_step, target_step, drafter, verify_cost)) for p in band)
    low, high = band_rates[0][1], band_rates[-1][1]
    if low > incumbent_rate:
        verdict = "win"
    elif high < incumbent_rate:
        verdict = "loss"
    else:
        verdict = "depends on acceptance"
    if load is not None and not load["pays"]:
        verdict = "loss"
    settling = ("measure p on your traffic: greedy continuation agreement of drafter and target on identical "
                "prompts (temperature 0, same tokenizer), or a paired `power bench PLAN --vs PLAN2` run on the "
                "engine the deployment runs")
    if measured is not None and measured.measured_p is not None:
        settling = (f"measured on {measured.engine}, {measured.shape!r} traffic: the candidate committed as if p = "
                    f"{measured.measured_p:.2f} at K={measured.k}; check it holds on the traffic you serve")
    return Report(
        target_step_s=target_step, draft_step_s=draft_step, k=k, drafter=drafter,
        draft_cost=modes.DRAFT_COST_TEXT[cost_of(drafter)], incumbent_rate=incumbent_rate,
        incumbent_commit=incumbent_commit, target_already_drafts=incumbent_commit > 1.0,
        break_even={d: break_even_p(d, draft_step, target_step, incumbent_rate, drafter, verify_cost) for d in depths},
        p_band=p_band, band_rates=band_rates, verdict=verdict, fit=fit, settling_measurement=settling,
        verify_cost=verify_cost,
        measured=measured.document() if measured else None, load=load,
    )


def under_load(evidence: dict[str, Any], shape: str, slots: int) -> dict[str, Any]:
    """The candidate's aggregate speedup with `slots` clients at once on `shape`, from the evidence's `concurrency`
    section (`power bench --concurrency 1,N`); ValueError when it was not measured there."""
    level = ((evidence.get("concurrency") or {}).get("per_level") or {}).get(str(slots), {}).get(shape)
    if not level or level.get("speedup") is None:
        raise ValueError(f"no measurement with {slots} clients at once on {shape!r}: rerun `power bench "
                         f"--concurrency 1,{slots}`")
    speedup = float(level["speedup"])
    return {"slots": slots, "shape": shape, "measured_speedup": speedup, "pays": speedup >= 1 + NOISE_BAND}


def render_text(report: Report) -> str:
    """The report in the order of docs/reference.md: already drafting; break-even; band and rate; fit and
    attachment; the measurement."""
    r = report
    source = (f"read from {r.measured['engine']}'s own timings on {r.measured['shape']!r}" if r.measured
              else "as given")
    lines = [
        f"1. Does the target already draft? {'yes' if r.target_already_drafts else 'no'} "
        f"(incumbent {r.incumbent_rate:.1f} tok/s at {r.incumbent_commit:.2f} commit/round; "
        f"target step {r.target_step_s * 1000:.1f} ms, draft step {r.draft_step_s * 1000:.1f} ms, {source}; "
        f"a verification pass of K + 1 rows costs {r.verify_cost:g} target steps)",
        f"2. Break-even acceptance p against the incumbent ({r.drafter}: {r.draft_cost}):",
    ]
    for depth, p in r.break_even.items():
        shown = f"{p:.2f}" if p is not None else "none (loses even at p = 1)"
        lines.append(f"     K={depth}: {shown}")
    rates = ", ".join(f"{value:.1f} tok/s at p={p:g}" for p, value in r.band_rates)
    lines.append(f"3. At K={r.k} over the realistic band: {rates}; "
                 f"incumbent {r.incumbent_rate:.1f} tok/s -> {r.verdict.upper()}")
    lines.append(f"   warning: {r.warning}")
    lines.append(f"4. Fit and attachment surface: {r.fit}")
    lines.append(f"5. The one measurement that settles it: {r.settling_measurement}")
    if r.load is not None:
        pays = ("it pays there" if r.load["pays"]
                else "it does not pay there, so this is a LOSS for a deployment that serves them")
        lines.append(f"6. With {r.load['slots']} slots busy: the candidate's aggregate was "
                     f"{r.load['measured_speedup']:.2f}x the incumbent's on {r.load['shape']!r} "
                     f"(`power bench --concurrency`): {pays}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Worth:
    k: int
    p: float  # per-position acceptance implied by the held-back mean accepted drafts at K
    target_step_s: float
    verify_cost: float
    draft_step_s: float
    speedup: float  # the drafter's rate over target-only's at p
    break_even_p: float | None  # the acceptance at which it would tie (None: not even p = 1)
    verdict: str  # worth_it.assess's: "win", "loss" or "depends on acceptance"

    @property
    def beats_target_only(self) -> bool:
        return self.verdict == "win"

    def document(self) -> dict[str, Any]:
        return {key: round(value, 4) if isinstance(value, float) else value
                for key, value in asdict(self).items()} | {"beats_target_only": self.beats_target_only}


def judge_distilled(costs: dict[str, Any], kind: str, k: int, mean_accepted: float) -> Worth:
    """A distilled drafter's verdict at K = `k` with `mean_accepted` drafts landed per round (its held-back curve's),
    against the target alone, with the round costs distill measured (`power.drafters.worth.Costs.document`)."""
    p = acceptance_of(1.0 + mean_accepted, k)
    step, draft, verify = costs["target_step_s"], costs["draft_s"][k], costs["verify_cost"][k]
    incumbent = 1.0 / step
    verdict = assess(step, draft, k, incumbent, p_band=(p, p), drafter=kind, verify_cost=verify).verdict
    return Worth(k, p, step, verify, draft, rate(p, k, draft, step, kind, verify) / incumbent,
                 break_even_p(k, draft, step, incumbent, kind, verify), verdict)
