"""`power bench`'s workflow over its arguments (`power.app.bench.request`, parsed and checked by
`power.app.arguments.bench`): place the configurations, stand the deployment down, load or start them, run the
protocol (alternating, or in turns), explain any greedy divergence, then judge, choose the winner and write the
evidence, the report and the env file; exit 1 when greedy outputs differ between the configurations (lossy)."""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import click

from power.app.bench import concurrency, configurations, harness, sweep
from power.app.bench.harness import BenchConfig, Measurement
from power.app.bench.lifecycle import Lifecycle
from power.app.bench.quiet import HostWatch
from power.app.bench.request import BenchArguments
from power.app.bench.residency import Residency, residency
from power.app.bench.standing import stand_down
from power.app.cli import EXIT_FINDINGS, refuse
from power.app.outputs import writing
from power.artifacts.atomic import write_text_atomic
from power.findings import PowerError
from power.orchestrator.engines import LIVE_ENGINES


@dataclass
class Measured:
    """What one bench ran and measured, and the record of how."""

    configs: list[BenchConfig] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)
    loaded: list = field(default_factory=list)  # the --concurrency levels' measurements
    explained: dict[str, dict[str, list]] = field(default_factory=dict)
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    servers: dict = field(default_factory=dict)  # the live servers, by label


def run(arguments: BenchArguments) -> None:
    """Measure, judge and write; print the table (or the evidence with --json)."""
    o = arguments.options
    placed = residency([resolved for _, _, resolved in arguments.plans], asked=o.one_at_a_time,
                       in_turns=arguments.engine in LIVE_ENGINES)
    click.echo(f"residency: {placed.reason}", err=True)
    measured = Measured()
    watch = HostWatch(lambda: {pid for server in measured.servers.values()
                               if (pid := configurations.pid(server)) is not None})
    with contextlib.ExitStack() as running:
        try:
            _measure(arguments, placed, watch, measured, running)
        except PowerError as err:
            refuse(err, o.as_json, at=o.plan)  # exits; the stack stops every server it started, restores the deployment
    documents = _documents(arguments, placed, watch, measured)
    best = harness.winner(documents) if o.baseline else None
    document = best or documents[0]
    if o.sweeps:
        document["sweep"] = sweep.section(documents, [label for label, _, _ in arguments.candidates], best)
    _write(arguments, document, best, measured.configs)
    if any(result["verdict"] == "lossy" for d in documents for result in d["shapes"].values()):
        sys.exit(EXIT_FINDINGS)


def _measure(arguments: BenchArguments, placed: Residency, watch: HostWatch, measured: Measured,
             running: contextlib.ExitStack) -> None:
    """Stand the deployment down, bring the configurations up, run the protocol and explain what differs."""
    o = arguments.options
    if o.deployment_port is not None:
        stand_down(o.deployment_port, measured.lifecycle, running)
    measured.configs = configurations.load(arguments.plans, arguments.engine, arguments.binary, o.device, o.threads,
                                           o.governor, o.root, running, measured.lifecycle, measured.servers,
                                           start=not placed.sequential)
    (_in_turns if placed.sequential else _side_by_side)(arguments, watch, measured)
    candidates = measured.configs[: len(arguments.candidates)]
    control = measured.configs[-1] if o.baseline else None
    measured.explained = _explained(candidates, control, o.traffic, measured, placed.sequential)


def _side_by_side(arguments: BenchArguments, watch: HostWatch, measured: Measured) -> None:
    o, progress = arguments.options, partial(click.echo, err=True)
    measured.measurements = harness.run_protocol(measured.configs, o.traffic, o.runs, progress, watch)
    if arguments.levels != [1]:
        measured.loaded = concurrency.run_levels(measured.configs, o.traffic, o.runs, arguments.levels, progress)


def _in_turns(arguments: BenchArguments, watch: HostWatch, measured: Measured) -> None:
    """One configuration resident at a time: each brought up, measured (at every --concurrency level too) and taken
    down in its turn."""
    o, levels, progress = arguments.options, arguments.levels, partial(click.echo, err=True)
    servers, lifecycle = measured.servers, measured.lifecycle

    def loaded(config: BenchConfig, run: int) -> None:
        measured.loaded.extend(concurrency.in_turn(config, run, o.traffic, levels, progress))

    measured.measurements = harness.run_in_turns(
        measured.configs, o.traffic, o.runs, progress,
        bring_up=lambda c: configurations.bring_up(servers[c.label], c.label, lifecycle),
        take_down=lambda c: configurations.take_down(servers[c.label], c.label, lifecycle),
        watch=watch, during_turn=loaded if levels != [1] else None)


def _explained(candidates: list[BenchConfig], control: BenchConfig | None, traffic, measured: Measured,
               sequential: bool) -> dict[str, dict[str, list]]:
    """Per candidate, per greedy shape whose outputs differ from the baseline's: each run's first divergence,
    replayed through the candidate's own llama-server without speculation (brought up again for it when the run
    went one at a time); on Power's runtime, exact by construction, and on vLLM, only where it happened."""
    from power.app.bench import divergence
    from power.app.live import protocol

    explained: dict[str, dict[str, list]] = {}
    if control is None:
        return explained
    for config in candidates:
        pairs = {shape.name: (shape, harness.receipts_of(measured.measurements, shape.name, config.label),
                              harness.receipts_of(measured.measurements, shape.name, control.label))
                 for shape in traffic}
        differing = {name: pair for name, pair in pairs.items() if pair[0].temperature == 0.0 and any(
            ours.token_ids != theirs.token_ids for ours, theirs in zip(pair[1], pair[2], strict=True))}
        if not differing:
            continue
        server = measured.servers.get(config.label)
        with contextlib.ExitStack() as turn:
            if server is not None and sequential:
                configurations.bring_up(server, config.label, measured.lifecycle)
                turn.callback(configurations.take_down, server, config.label, measured.lifecycle)
            # the native /completion reads the target's log-probabilities (n_probs); an OpenAI-shaped server is
            # not replayed here, so its divergences stay unexplained, which is lossy (fail closed)
            replay = (partial(divergence.explain, server)
                      if server is not None and protocol(server.engine).native else None)
            explained[config.label] = {name: harness.divergences(ours, theirs, shape, replay)
                                       for name, (shape, ours, theirs) in differing.items()}
    return explained


def _documents(arguments: BenchArguments, placed: Residency, watch: HostWatch,
               measured: Measured) -> list[dict[str, Any]]:
    """One evidence document per candidate against the baseline, with the host's samples and the load levels."""
    o, levels, configs = arguments.options, arguments.levels, measured.configs
    control = configs[-1] if o.baseline else None
    host = watch.document()
    if host["busy"]:
        click.echo(f"note: a busy host: {host['reason']}; ratios measured now may not hold on a quiet one", err=True)
    documents = [harness.evidence(config, control, o.traffic, o.runs, o.max_tokens, measured.measurements, placed,
                                  measured.lifecycle.events, host, measured.explained.get(config.label),
                                  o.near_tie_margin)
                 for config in configs[: len(arguments.candidates)]]
    if levels != [1]:
        for config, document in zip(configs, documents, strict=False):
            roles = {config.label: harness.CANDIDATE} | ({control.label: harness.BASELINE} if control else {})
            document["concurrency"] = concurrency.section(measured.loaded, roles, levels, [s.name for s in o.traffic],
                                                          arguments.slots)
    return documents


def _write(arguments: BenchArguments, document: dict[str, Any], best: dict[str, Any] | None,
           configs: list[BenchConfig]) -> None:
    """The evidence, the report and the env file where asked; the table (or the document) on stdout."""
    from power.app.bench.env_file import env_file_text
    from power.app.bench.report import text_table, write_report

    o = arguments.options
    if o.output is not None:
        with writing(o.output, o.as_json):
            harness.write_evidence(document, o.output)
        click.echo(f"wrote {o.output}", err=True)
    if o.report is not None:
        with writing(o.report, o.as_json):
            write_report(document, o.report)
        click.echo(f"wrote {o.report}", err=True)
    table = (sweep.table(document["sweep"]) + "\n" if o.sweeps else "") + text_table(document)
    if o.env_path is not None:
        control = configs[-1] if o.baseline else None
        with writing(o.env_path, o.as_json):
            write_text_atomic(o.env_path, env_file_text(arguments.engine, best, configs, control, table))
        click.echo(f"wrote {o.env_path}", err=True)
    click.echo(json.dumps(document, indent=2, ensure_ascii=False) if o.as_json else table, nl=not o.as_json)
