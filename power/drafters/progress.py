"""Progress bars for distill's phases: over the wall time the budget gives a phase, so the bar and its ETA are the
budget's (a count of steps or prompts the budget never reaches would show an ETA of hundreds of hours); the counts
ride along as the bar's postfix. Without a deadline a bar counts its items."""

from __future__ import annotations

import time
from typing import Any

from tqdm import tqdm


class BudgetBar:
    def __init__(self, desc: str, deadline: float | None, total: int, unit: str, enabled: bool,
                 initial: int = 0) -> None:
        self.deadline, self.started = deadline, time.monotonic()
        self.seconds = 0 if deadline is None else max(0, round(deadline - self.started))
        if deadline is None:
            self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=not enabled)
        else:
            self.bar = tqdm(total=self.seconds, desc=f"{desc} (budget)", unit="s", disable=not enabled,
                            bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s{postfix}")

    def advance(self, **postfix: Any) -> None:
        """One item done: a step or a prompt (the counts it shows go in `postfix`)."""
        if self.deadline is None:
            self.bar.update()
        else:
            self.bar.n = min(round(time.monotonic() - self.started), self.seconds)
        self.bar.set_postfix(**postfix)

    def close(self) -> None:
        self.bar.close()
