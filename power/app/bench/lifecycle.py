"""What `power bench` started and stopped, in order: the evidence's `lifecycle` record (docs/bench.md).

Every configuration brought up or taken down, and the deployment's own server
stopped and restored (`power.app.bench.standing`), is an event with the seconds since
the bench began, so the evidence shows the protocol that ran, not only its
figures.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Lifecycle:
    events: list[dict[str, Any]] = field(default_factory=list)
    _began: float = field(default_factory=time.monotonic)

    def event(self, event: str, what: str, **details: Any) -> None:
        """`event`: start | healthy | stop | stopped; `what`: a configuration's label, or "deployment"."""
        self.events.append({"at_s": round(time.monotonic() - self._began, 3), "event": event, "what": what, **details})
