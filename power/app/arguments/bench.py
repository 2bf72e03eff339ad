"""`power bench`'s arguments, in two stages: the options alone (`parse_bench`: the outputs, the traffic shapes, the
report's format), then with the plans loaded (`resolve_bench`: the engine and its binary, the baseline, the sweep's
variants, the device, the concurrency levels). Each refusal that needs no model is made here, before the runtime's
stack is imported; the command runs the record."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import click

from power.app.arguments.runtime_options import refuse_unusable_device
from power.app.bench.request import BenchArguments, BenchOptions
from power.app.cli import refuse
from power.app.outputs import require_outputs
from power.documents.evidence import BASELINE, CANDIDATE
from power.findings import PowerError
from power.orchestrator.engines import ADAPTERS, LIVE_ENGINES

if TYPE_CHECKING:
    from power.documents.plan import ResolvedPlan

# The engines whose deployment reads an env file `--write-env` renders (its adapter's `env_target`).
WRITES_ENV = tuple(name for name, engine in ADAPTERS.items() if engine.env_target is not None)


def parse_bench(plan: Path, baseline: Path | None, engine: str | None, engine_binary: Path | None, shapes: str,
                runs: int, max_tokens: int, prompt_tokens: int | None, sweeps: tuple[str, ...], output: Path | None,
                report: Path | None, env_path: Path | None, one_at_a_time: bool, deployment_port: int | None,
                concurrency_text: str, near_tie_margin: float, governor: bool, device: str, threads: int | None,
                root: Path | None, as_json: bool) -> BenchOptions:
    """The options' record; the command ends on an output that cannot be written, and click.BadParameter (exit 2)
    names a shape, a report format or a token count that cannot run."""
    require_outputs(files=(output, report, env_path), as_json=as_json)
    from power.app.bench.report import REPORT_FORMATS
    from power.app.bench.traffic import REFERENCE_PROMPT_TOKENS, build_shape, parse_shapes

    try:
        names = parse_shapes(shapes)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--shapes") from None
    if report is not None and report.suffix not in REPORT_FORMATS:
        raise click.BadParameter(f"{report}: give a .md or .html file name", param_hint="--report")
    try:
        traffic = [build_shape(name, max_tokens, prompt_tokens or REFERENCE_PROMPT_TOKENS) for name in names]
    except ValueError as err:
        raise click.BadParameter(f"{max_tokens}: {err}", param_hint="--max-tokens") from None
    return BenchOptions(plan, baseline, engine, engine_binary, traffic, runs, max_tokens, sweeps, output, report,
                        env_path, one_at_a_time, deployment_port, concurrency_text, near_tie_margin, governor, device,
                        threads, root, as_json)


def resolve_bench(options: BenchOptions) -> BenchArguments:
    """The record with its plans loaded; the command ends on a plan, binary, sweep, device, prompt, turn or
    concurrency level it cannot run (a finding that names no file of its own is located at the candidate plan where
    the plan is its cause), and click.UsageError (exit 2) for --write-env on an engine without an env file."""
    from power.app import live
    from power.app.bench import sweep
    from power.documents.plan import load_plan, located

    o = options
    try:
        candidate_plan = located(load_plan(o.plan), o.plan, o.root)
    except PowerError as err:
        refuse(err, o.as_json)
    engine = o.engine or candidate_plan.memory.engine
    if o.env_path is not None and engine not in WRITES_ENV:
        raise click.UsageError(f"--write-env: a {engine} deployment has no env file Power renders; use "
                               f"--engine {' or '.join(WRITES_ENV)}")
    try:
        binary = live.engine_binary(engine, o.engine_binary) if engine in LIVE_ENGINES else None
        measured_against = ([(BASELINE, o.baseline, located(load_plan(o.baseline), o.baseline, o.root))]
                            if o.baseline is not None else [])
        candidates = [(CANDIDATE, o.plan, candidate_plan)]
        if o.sweeps:
            folder = (o.output.parent / f"{o.output.stem}.sweep" if o.output
                      else Path(tempfile.mkdtemp(prefix="power-sweep-")))
            candidates = sweep.variants(candidate_plan, sweep.parse(list(o.sweeps)), folder)
        plans = candidates + measured_against
    except PowerError as err:
        refuse(err, o.as_json)
    if engine not in LIVE_ENGINES:
        refuse_unusable_device(o.device, o.as_json)
    _refuse_what_the_engine_cannot_run(o, engine, plans)
    slots = min(resolved.memory.slots.slots for _, _, resolved in plans)
    from power.app.bench import concurrency

    try:
        levels = concurrency.parse_levels(o.concurrency, slots)
    except PowerError as err:
        refuse(err, o.as_json, at=o.plan)
    return BenchArguments(options, engine, binary, candidates, plans, levels, slots)


def _refuse_what_the_engine_cannot_run(options: BenchOptions, engine: str,
                                       plans: list[tuple[str, Path, ResolvedPlan]]) -> None:
    """On Power's runtime, a prompt longer than a plan's context and --one-at-a-time (it loads every plan side by
    side) are refused; a plan sized for another engine is measured, and said so."""
    from power.app.bench import harness

    if engine not in LIVE_ENGINES:
        try:
            harness.require_prompts_fit(plans, options.traffic, options.root)
        except PowerError as err:
            refuse(err, options.as_json, at=options.plan)
    for label, path, resolved in plans:
        if resolved.memory.engine != engine:
            click.echo(f"note: {label} {path} was sized for {resolved.memory.engine}; measuring it on {engine}: "
                       f"its evidence counts for {engine} deployments only", err=True)
    if not options.governor and engine in LIVE_ENGINES:
        raise click.UsageError(f"--governor off: {engine} has no cost governor to turn off; it is Power's runtime's "
                               "(drop the option, or measure with --engine power)")
    if options.one_at_a_time and engine not in LIVE_ENGINES:
        refuse(PowerError("--one-at-a-time: Power's runtime loads every plan in this process, side by side",
                          code="PWR474", hint="measure one at a time on the deployment's live engine (--engine "
                          "llama-server or vllm)"), options.as_json, at=options.plan)
