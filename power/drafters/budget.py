"""The wall-time budget of `power drafter distill`, held by construction: a phase starts only when its cost,
measured beforehand (one training step, one held-back evaluation, one checkpoint, writing the drafter out, one
replayed sequence), fits in what is left beside what the phases after it need; each phase's seconds are recorded
for the report (`distill.json`'s `budget`)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from power.findings import PowerError

Clock = Callable[[], float]  # seconds, monotonic
# The share of the budget no decision may spend: what no phase is charged for (building and writing the report,
# milliseconds) and a measured cost that comes out a little longer when the work runs again.
MARGIN = 0.01


class BudgetError(PowerError):
    """The budget cannot hold the phases after training beside what was already spent: nothing is trained."""

    code = "PWR027"


class Budget:
    def __init__(self, seconds: float, clock: Clock = time.monotonic, started: float | None = None) -> None:
        self.seconds = seconds
        self.clock = clock
        self.started = clock() if started is None else started  # a run charged from before the budget was made
        self.deadline = self.started + seconds
        self.phases: dict[str, float] = {}

    def left(self) -> float:
        return self.deadline - self.clock()

    def fits(self, cost: float) -> bool:
        """Whether work of `cost` seconds, started now, ends by the deadline less the margin."""
        return cost <= self.left() - self.seconds * MARGIN

    def share(self, fraction: float) -> float:
        """The instant `fraction` of the budget after its start."""
        return self.started + self.seconds * fraction

    def charge(self, name: str, since: float) -> None:
        """Phase `name` ran from `since` until now."""
        self.phases[name] = self.phases.get(name, 0.0) + self.clock() - since

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        began = self.clock()
        try:
            yield
        finally:
            self.charge(name, began)

    def document(self) -> dict[str, Any]:
        return {"budget_s": round(self.seconds, 3), "spent_s": round(self.clock() - self.started, 3),
                "phases_s": {name: round(seconds, 3) for name, seconds in self.phases.items()}}
