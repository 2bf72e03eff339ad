"""Whether a distilled drafter can beat target-only on this machine: the worth-it arithmetic with costs measured here.

The costs do not depend on the weights, so they are timed before training, on the
drafter as first written (counted inside the budget): the target's one-row step,
its verification pass of K + 1 rows and the drafter's proposal of K drafts, for
each K distill may recommend, as the runtime runs them (medians of interleaved
repeats). After training, the held-back acceptance at the recommended K gives p
(`worth_it.acceptance_of`) and `worth_it.assess` prices the drafter against the
target alone. A drafter that cannot beat it is not worth deploying: distill says
so instead of suggesting a plan (issue 40 item 4).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from power.orchestrator.worth_it import acceptance_of, assess, break_even_p, rate
from power.runtime.gguf_weights import GGUFFile
from power.runtime.speculators import registry
from power.runtime.speculators.base import DraftContext, SpeculatorRequest
from power.runtime.trunks import load_trunk

REPEATS = 5


@dataclass(frozen=True)
class Costs:
    """What one round costs on this machine: the target's one-row step, and per K the verification pass of K + 1
    rows (in one-row steps) and the drafter's proposal of K drafts (seconds)."""

    target_step_s: float
    verify_cost: dict[int, float]
    draft_s: dict[int, float]


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


def measure(target: Path, drafter: Path, kind: str, widths: Sequence[int], context: Sequence[int]) -> Costs:
    """The costs of the `kind` drafter file beside its target at each K of `widths`, after `context` (a held-back
    sequence's tokens, at least two)."""
    gguf = GGUFFile(target)
    deepest = max(widths)
    trunk = load_trunk(gguf, n_ctx=len(context) + deepest + 2, verify_capacity=deepest + 1)
    committed = list(context[:-1])
    trunk.reset()
    trunk.prefill(committed)
    length = trunk.position
    times: dict[int, list[float]] = {rows: [] for rows in (1, *(k + 1 for k in widths))}
    for _ in range(REPEATS):
        for rows, taken in times.items():
            started = time.perf_counter()
            trunk.forward(list(context[-1:]) * rows)
            taken.append(time.perf_counter() - started)
            trunk.rewind(length)
    one = statistics.median(times[1])
    speculator = registry.create(kind, SpeculatorRequest(trunk, target=gguf, drafter=GGUFFile(drafter)))
    trunk.reset()
    speculator.begin(committed)
    speculator.commit(committed, trunk.prefill(committed, taps=speculator.taps).hidden, 0)
    speculator.propose(DraftContext(list(context), 1))  # the first proposal catches up on the context: paid once
    drafts: dict[int, list[float]] = {k: [] for k in widths}
    for _ in range(REPEATS):
        for k, taken in drafts.items():
            started = time.perf_counter()
            speculator.propose(DraftContext(list(context), k))
            taken.append(time.perf_counter() - started)
    return Costs(one, {k: statistics.median(times[k + 1]) / one for k in widths},
                 {k: statistics.median(taken) for k, taken in drafts.items()})


def judge(costs: Costs, kind: str, k: int, mean_accepted: float) -> Worth:
    """The verdict at K = `k` with `mean_accepted` drafts landed per round (the held-back curve's)."""
    p = acceptance_of(1.0 + mean_accepted, k)
    step, draft, verify = costs.target_step_s, costs.draft_s[k], costs.verify_cost[k]
    incumbent = 1.0 / step
    verdict = assess(step, draft, k, incumbent, p_band=(p, p), drafter=kind, verify_cost=verify).verdict
    return Worth(k, p, step, verify, draft, rate(p, k, draft, step, kind, verify) / incumbent,
                 break_even_p(k, draft, step, incumbent, kind, verify), verdict)
