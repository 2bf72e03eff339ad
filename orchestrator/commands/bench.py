"""`power bench PLAN [--vs PLAN2] [--shapes ...]`: the A/B protocol -> a per-shape table, evidence and a report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from power.findings import PowerError
from power.orchestrator.cli import EXIT_FINDINGS, refuse
from power.orchestrator.commands.artifact_root import root_option
from power.orchestrator.commands.runtime_options import runtime_options
from power.orchestrator.outputs import require_outputs, writing


@click.command("bench")
@click.argument("plan", type=click.Path(path_type=Path))
@click.option("--vs", "baseline", type=click.Path(path_type=Path), default=None,
              help="The baseline plan: the incumbent, or a zero-draft control such as a target-only plan.")
@click.option("--shapes", default="prose,echo,structured,identity", show_default=True,
              help="Traffic shapes to run, comma-separated: prose, echo, structured, identity.")
@click.option("--runs", type=click.IntRange(min=1), default=3, show_default=True,
              help="Measured runs per configuration and shape (alternating A/B, B/A, ...).")
@click.option("--max-tokens", type=click.IntRange(min=2), default=64, show_default=True,
              help="Tokens per request (the identity shape stops at 16).")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Write the power.evidence/v1 document here (atomically).")
@click.option("--report", type=click.Path(path_type=Path), default=None,
              help="Write a report with a per-shape chart: report.md (Markdown) or report.html.")
@runtime_options(default_dtype="bfloat16")
@root_option
@click.option("--json", "as_json", is_flag=True, help="Print the evidence document instead of the table.")
def bench(plan: Path, baseline: Path | None, shapes: str, runs: int, max_tokens: int, output: Path | None,
          report: Path | None, device: str, dtype: str, lm_head_dtype: str | None, threads: int | None,
          root: Path | None, as_json: bool) -> None:
    """Paired, alternating runs of PLAN (the candidate) and --vs PLAN2 (the baseline) over fixed traffic shapes.

    Prints decode tok/s per shape (median and spread), acceptance, mean accepted
    length, replay/fallback counts, greedy parity and a per-shape verdict ("a
    traffic decision, not a winner"). Exit codes: 0 measured (and, with --vs,
    no greedy output differed), 1 greedy outputs differ between the
    configurations (lossy), 2 usage or input error. Both configurations load with the same dtypes.
    """
    require_outputs(files=(output, report), as_json=as_json)
    from power.orchestrator.plan import load_plan
    from power.runtime import bench as harness
    from power.runtime.bench_report import REPORT_FORMATS, text_table, write_report
    from power.runtime.engine import Engine, EngineOptions, Workload
    from power.runtime.traffic import build_shape, parse_shapes

    try:
        names = parse_shapes(shapes)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--shapes") from None
    if report is not None and report.suffix not in REPORT_FORMATS:
        raise click.BadParameter(f"{report}: give a .md or .html file name", param_hint="--report")
    try:
        traffic = [build_shape(name, max_tokens) for name in names]
    except ValueError as err:
        raise click.BadParameter(f"{max_tokens}: {err}", param_hint="--max-tokens") from None
    paths = [(harness.CANDIDATE, plan)] + ([(harness.BASELINE, baseline)] if baseline else [])
    try:
        plans = [(label, path, load_plan(path)) for label, path in paths]
        configs = []
        for label, path, resolved in plans:
            click.echo(f"loading {label}: {path} (mode {resolved.mode.resolved})", err=True)
            options = EngineOptions(device=device, dtype=dtype, lm_head_dtype=lm_head_dtype, threads=threads)
            engine = Engine(Workload.of_plan(resolved, path, root), options)
            configs.append(harness.BenchConfig(label, path, resolved, engine))
        measurements = harness.run_protocol(configs, traffic, runs, lambda line: click.echo(line, err=True))
    except PowerError as err:
        refuse(err, as_json)
    document = harness.evidence(configs, traffic, runs, max_tokens, measurements)
    if output is not None:
        with writing(output, as_json):
            harness.write_evidence(document, output)
        click.echo(f"wrote {output}", err=True)
    if report is not None:
        with writing(report, as_json):
            write_report(document, report)
        click.echo(f"wrote {report}", err=True)
    click.echo(json.dumps(document, indent=2, ensure_ascii=False) if as_json else text_table(document), nl=not as_json)
    if any(result["verdict"] == "lossy" for result in document["shapes"].values()):
        sys.exit(EXIT_FINDINGS)

