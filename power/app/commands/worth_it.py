"""`power worth-it`: break-even arithmetic for a drafter against the incumbent."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click

from power import modes
from power.app.cli import refuse
from power.app.commands.params import FiniteFloatRange
from power.artifacts.bounded_reader import DocumentError, read_json
from power.documents.plan import PlanError, load_plan
from power.findings import PowerError
from power.orchestrator.fleet.evidence import EVIDENCE_SCHEMA
from power.orchestrator.planning import worth_it as arithmetic


class EvidenceInputError(PowerError):
    """An evidence file worth-it cannot read step times from."""

    code = "PWR071"

_DURATION = re.compile(r"^\s*(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>ms|s)\s*$")
# One step of a model, target or drafter, longer than an hour is not a measurement.
MAX_STEP_S = 3600.0


class Duration(click.ParamType):
    name = "duration"

    def convert(self, value, param, ctx) -> float:
        if isinstance(value, float):
            return value
        match = _DURATION.match(str(value))
        if match is None or float(match["number"]) <= 0:
            self.fail(f"{value!r} is not a positive duration; write it with a unit, e.g. 67ms or 0.067s", param, ctx)
        seconds = float(match["number"]) / (1000 if match["unit"] == "ms" else 1)
        if seconds > MAX_STEP_S:
            self.fail(f"{value!r} is longer than an hour: no model step takes that long", param, ctx)
        return seconds


class Band(click.ParamType):
    name = "low:high"

    def convert(self, value, param, ctx) -> tuple[float, float]:
        if isinstance(value, tuple):
            return value
        try:
            low, high = (float(part) for part in str(value).split(":"))
        except ValueError:
            self.fail(f"{value!r} is not a band; write two acceptance rates as LOW:HIGH, e.g. 0.4:0.6", param, ctx)
        if not 0.0 <= low <= high < 1.0:
            self.fail(f"{value!r}: need 0 <= LOW <= HIGH < 1", param, ctx)
        return (low, high)


@click.command("worth-it")
@click.option("--target-step", type=Duration(), help="Target step time t_s (e.g. 67ms); default: incumbent commit per "
                                                     "round / incumbent rate.")
@click.option("--draft-step", type=Duration(), help="Drafter step time d_s (e.g. 12ms): one forward of the drafter.")
@click.option("--drafter", type=click.Choice([m.name for m in modes.MODES]), default=modes.DRAFT_MODEL,
              show_default=True, help="The drafter's kind, which prices a round: a plain model (draft-model) runs K "
              "forwards, a trained head (mtp, dflash, dflash2, dspark) about one, n-gram none.")
@click.option("-k", "k", type=click.IntRange(1, 64), help="K: proposals per round.")
@click.option("--incumbent", type=FiniteFloatRange(min=0, min_open=True),
              help="The rate the operator sees today, tok/s (the incumbent may already speculate).")
@click.option("--incumbent-commit", type=FiniteFloatRange(min=1.0), default=1.0, show_default=True,
              help="Tokens the incumbent commits per target step (>1 when it already drafts).")
@click.option("--evidence", "evidence_path", type=click.Path(path_type=Path),
              help="A `power bench` evidence file: t_s, d_s, K, the drafter and the incumbent's rate come from the "
              "engine's own timings (candidate = the drafter, baseline = the incumbent).")
@click.option("--shape", help="With --evidence: the traffic shape to read (default: prose, else the first).")
@click.option("--p-band", type=Band(), default="0.4:0.6", show_default=True, help="Realistic acceptance band.")
@click.option("--verify-cost", type=FiniteFloatRange(min=0, min_open=True), default=arithmetic.VERIFY_COST,
              show_default=True, help="What one verification pass of K + 1 rows costs, in target steps: about 1.1 on "
              "a GPU engine; more on a CPU, where extra rows are not free (bench/bench_drafter.py measures it).")
@click.option("--plan", "plan_path", type=click.Path(path_type=Path),
              help="A compiled plan for the drafter: its VRAM verdict and attachment go in the report.")
@click.option("--slots", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="The clients the deployment serves at once: above 1, the verdict also needs the candidate to pay "
              "at that many, measured (--evidence from `power bench --concurrency 1,N`); the arithmetic alone is "
              "single-stream.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def worth_it(target_step, draft_step, drafter, k, incumbent, incumbent_commit, evidence_path, shape, p_band,
             verify_cost, plan_path, slots, as_json) -> None:
    """Is a drafter worth it? Break-even acceptance and the rate over a realistic band, against the incumbent."""
    measured, load = None, None
    if slots > 1 and evidence_path is None:
        raise click.UsageError(f"--slots {slots}: the break-even arithmetic is single-stream; with {slots} clients at "
                               f"once the verification rows compete with theirs, so give --evidence from `power bench "
                               f"--concurrency 1,{slots}`")
    if evidence_path is not None:
        measured = _measured(evidence_path, shape, verify_cost, as_json)
        if slots > 1:
            load = _load(evidence_path, measured.shape, slots, as_json)
        target_step, draft_step, drafter, k = measured.target_step, measured.draft_step, measured.drafter, measured.k
        incumbent, incumbent_commit = measured.incumbent_rate, measured.incumbent_commit
    missing = [name for name, value in (("--draft-step", draft_step), ("-k", k), ("--incumbent", incumbent))
               if value is None]
    if missing:
        raise click.UsageError(f"give {', '.join(missing)} (or --evidence FILE from `power bench`)")
    if target_step is None:
        target_step = incumbent_commit / incumbent  # step 1: t_s = 1 / (tok/s / commit per round)
    fit = arithmetic.UNPLANNED_FIT
    if plan_path is not None:
        try:
            fit = arithmetic.fit_of(load_plan(plan_path))
        except PlanError as err:
            refuse(err, as_json)
    report = arithmetic.assess(target_step, draft_step, k, incumbent, incumbent_commit, p_band, fit, drafter, measured,
                               verify_cost, load)
    click.echo(json.dumps(report.to_json(), indent=2) if as_json else arithmetic.render_text(report))


def _measured(path: Path, shape: str | None, verify_cost: float, as_json: bool) -> arithmetic.MeasuredSteps:
    hint = "pass a file written by `power bench CANDIDATE --vs BASELINE -o FILE`"
    try:
        document = read_json(path)
    except DocumentError as err:
        refuse(EvidenceInputError(err.finding("PWR071", path, hint, what="the evidence file").message,
                                  file=str(path), hint=hint), as_json)
    try:
        if not isinstance(document, dict) or document.get("schema") != EVIDENCE_SCHEMA:
            raise ValueError(f"not a {EVIDENCE_SCHEMA} document")
        return arithmetic.steps_from_evidence(document, shape, verify_cost)
    except (ValueError, KeyError, TypeError) as err:
        refuse(EvidenceInputError(f"cannot read step times from the evidence ({err})", file=str(path), hint=hint),
               as_json)


def _load(path: Path, shape: str, slots: int, as_json: bool) -> dict:
    try:
        return arithmetic.under_load(read_json(path), shape, slots)
    except (DocumentError, ValueError) as err:
        refuse(EvidenceInputError(f"cannot judge {slots} slots from the evidence: {err}", file=str(path),
                                  hint=f"rerun `power bench CANDIDATE --vs BASELINE --concurrency 1,{slots} -o FILE`"),
               as_json)
