"""Whether a distilled drafter can beat target-only on this machine: the worth-it arithmetic with costs measured here.

The costs do not depend on the weights, so they are timed before training, on the
drafter as first written (counted inside the budget): the target's one-row step,
its verification pass of K + 1 rows and the drafter's proposal of K drafts, for
each K distill may recommend, as the runtime runs them (medians of interleaved
repeats). After training, `power.orchestrator.planning.worth_it.judge_distilled` prices the
recommended K at the held-back acceptance against the target alone; a drafter
that cannot beat it is not worth deploying: distill says so instead of
suggesting a plan (issue 40 item 4).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

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

    def document(self) -> dict[str, Any]:
        return asdict(self)


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
