"""What one `power bench` runs: its options' record and, with its plans loaded, the arguments the workflow
(`power.app.bench.workflow`) runs; `power.app.arguments.bench` parses and checks them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from power.app.bench.traffic import TrafficShape
    from power.documents.plan import ResolvedPlan


@dataclass(frozen=True)
class BenchOptions:
    """What the options say on their own."""

    plan: Path
    baseline: Path | None
    engine: str | None  # None: the engine the candidate plan was sized for
    engine_binary: Path | None
    traffic: list[TrafficShape]
    runs: int
    max_tokens: int
    sweeps: tuple[str, ...]
    output: Path | None
    report: Path | None
    env_path: Path | None
    one_at_a_time: bool
    deployment_port: int | None
    concurrency: str
    near_tie_margin: float
    governor: bool  # Power's runtime: the cost governor on (as deployed) or off (every round drafts)
    device: str
    threads: int | None
    root: Path | None
    as_json: bool


@dataclass(frozen=True)
class BenchArguments:
    """The options with the plans loaded: what one `power bench` measures, on which engine."""

    options: BenchOptions
    engine: str
    binary: Path | None  # the live engine's executable (None: Power's runtime, in this process)
    candidates: list[tuple[str, Path, ResolvedPlan]]  # the candidate, or the sweep's variants
    plans: list[tuple[str, Path, ResolvedPlan]]  # the candidates, then the baseline if there is one
    levels: list[int]  # the --concurrency levels
    slots: int  # the fewest slots of any plan
