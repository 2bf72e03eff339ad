"""`power bench PLAN [--vs PLAN2] [--engine ...] [--sweep ...]`: the A/B protocol -> a per-shape table, evidence,
a report, and the winner as a deployment env file."""

from __future__ import annotations

import contextlib
import json
import sys
from functools import partial
from pathlib import Path

import click

from power.app.arguments.bench import BenchArguments, parse_bench, resolve_bench
from power.app.cli import EXIT_FINDINGS, refuse
from power.app.commands.artifact_root import root_option
from power.app.commands.runtime_options import runtime_options
from power.app.divergence import DEFAULT_MARGIN
from power.app.lifecycle import Lifecycle
from power.app.outputs import writing
from power.app.quiet import HostWatch
from power.app.traffic import DEFAULT_SHAPES
from power.artifacts.atomic import write_text_atomic
from power.findings import PowerError
from power.orchestrator.engines import ENGINES, LIVE_ENGINES


@click.command("bench")
@click.argument("plan", type=click.Path(path_type=Path))
@click.option("--vs", "baseline", type=click.Path(path_type=Path), default=None,
              help="The baseline plan: the incumbent, or a zero-draft control such as a target-only plan.")
@click.option("--engine", type=click.Choice(ENGINES), default=None,
              help="The engine both plans run on: Power's runtime in this process, or a live llama-server / vLLM "
              "launched from each plan's render on a free loopback port (and stopped afterwards). Default: the "
              "engine the candidate plan was compiled (sized) for.")
@click.option("--engine-binary", type=click.Path(path_type=Path), default=None,
              help="The llama-server / vllm executable (default: $POWER_LLAMA_SERVER / $POWER_VLLM, else PATH).")
@click.option("--shapes", default=",".join(DEFAULT_SHAPES), show_default=True,
              help="Traffic shapes to run, comma-separated: prose, echo, structured, identity (generated), and "
                   "writing, code, chat (natural held-out requests, a different one each run).")
@click.option("--runs", type=click.IntRange(min=1), default=3, show_default=True,
              help="Measured runs per configuration and shape (alternating A/B, B/A, ...).")
@click.option("--max-tokens", type=click.IntRange(min=2), default=64, show_default=True,
              help="Tokens per request (the identity shape stops at 16).")
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=None,
              help="The echo passage's size in (Gemma-like) tokens (default: ~1.5k, docs/reference.md, "
              "1536); prose filler is 2/3 of it.")
@click.option("--sweep", "sweeps", multiple=True, metavar="SETTING=V1,V2,...",
              help="Run variants of PLAN in the same run: k=3,5,7 (draft depth), window=2/7,48/64 (n-gram draft "
              "lengths), ngram_match=4,24 ...; several --sweep combine. The winner becomes the evidence.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Write the power.evidence/v1 document here (atomically).")
@click.option("--report", type=click.Path(path_type=Path), default=None,
              help="Write a report with a per-shape chart: report.md (Markdown) or report.html.")
@click.option("--write-env", "env_path", type=click.Path(path_type=Path), default=None,
              help="Write the winner (else the incumbent) as the deployment's env file, the measured table as its "
              "comment: LLAMA_ARG_* for llama-server, POWER_* for power.")
@click.option("--one-at-a-time", is_flag=True,
              help="Run the configurations in turn (each started, warmed, measured, stopped), as when their summed "
              "sizing does not fit the device, which the bench checks by itself. Live engines only.")
@click.option("--deployment-port", type=click.IntRange(1, 65535), default=None,
              help="The port the deployment's own engine serves on: a server found there is stopped before the "
              "bench (its systemd unit with systemctl, else the process; a container's is refused) and started again "
              "the same way when the bench ends, also on a failure or Ctrl-C.")
@click.option("--concurrency", "concurrency_text", default="1", show_default=True, metavar="N1,N2,...",
              help="Also drive each configuration with this many clients at once on every shape (e.g. 1,4,8; at "
              "most the plans' slots): per level the aggregate and per-request figures, and the level where the "
              "candidate stops paying. 1 alone: single-stream only.")
@click.option("--near-tie-margin", type=click.FloatRange(min=0.0), default=DEFAULT_MARGIN, show_default=True,
              help="Nats between the target's own log-probabilities of two tokens below which a greedy divergence is "
              "a near-tie (arithmetic) rather than lossy; read at each first divergence without speculation.")
@runtime_options
@root_option
@click.option("--json", "as_json", is_flag=True, help="Print the evidence document instead of the table.")
def bench(plan: Path, baseline: Path | None, engine: str, engine_binary: Path | None, shapes: str, runs: int,
          max_tokens: int, prompt_tokens: int | None, sweeps: tuple[str, ...], output: Path | None, report: Path | None,
          env_path: Path | None, one_at_a_time: bool, deployment_port: int | None, concurrency_text: str,
          near_tie_margin: float, device: str, threads: int | None, root: Path | None, as_json: bool) -> None:
    """Paired, alternating runs of PLAN (the candidate) and --vs PLAN2 (the baseline) over fixed traffic shapes.

    Prints decode tok/s per shape (median and spread), acceptance, mean accepted
    length, replay/fallback counts, greedy parity and a per-shape verdict ("a
    traffic decision, not a winner"). With --engine llama-server|vllm both plans
    run on that engine as `power render` prints them, and the evidence says which
    engine and build produced it. Exit codes: 0 measured (and, with --vs, no greedy
    output differed), 1 greedy outputs differ between the configurations (lossy),
    2 usage or input error (a missing engine binary included: nothing is measured).
    """
    arguments = resolve_bench(parse_bench(plan, baseline, engine, engine_binary, shapes, runs, max_tokens,
                                          prompt_tokens, sweeps, output, report, env_path, one_at_a_time,
                                          deployment_port, concurrency_text, near_tie_margin, device, threads, root,
                                          as_json))
    _measure(arguments)


def _measure(arguments: BenchArguments) -> None:
    """Run the configurations, write the evidence, the report and the env file, print the table; exit 1 when greedy
    outputs differ between them (lossy)."""
    from power.app import bench as harness
    from power.app import concurrency, sweep
    from power.app.bench_report import text_table, write_report
    from power.app.residency import residency

    o, engine, plans, levels = arguments.options, arguments.engine, arguments.plans, arguments.levels
    loaded: list = []  # the --concurrency levels' measurements
    placed = residency([resolved for _, _, resolved in plans], asked=o.one_at_a_time,
                       in_turns=engine in LIVE_ENGINES)
    click.echo(f"residency: {placed.reason}", err=True)
    lifecycle = Lifecycle()
    progress = partial(click.echo, err=True)
    servers: dict = {}
    watch = HostWatch(lambda: {pid for server in servers.values() if (pid := _pid(server)) is not None})
    with contextlib.ExitStack() as running:
        try:
            if o.deployment_port is not None:
                _stand_down(o.deployment_port, lifecycle, running)
            configs = _configs(plans, engine, arguments.binary, o.device, o.threads, o.root, running, lifecycle,
                               servers, start=not placed.sequential)
            if placed.sequential:
                measurements = harness.run_in_turns(
                    configs,
                    o.traffic,
                    o.runs,
                    progress,
                    bring_up=lambda c: _bring_up(servers[c.label], c.label, lifecycle),
                    take_down=lambda c: _take_down(servers[c.label], c.label, lifecycle),
                    watch=watch,
                    during_turn=(lambda c, run: loaded.extend(concurrency.in_turn(c, run, o.traffic, levels, progress)))
                    if levels != [1]
                    else None,
                )
            else:
                measurements = harness.run_protocol(configs, o.traffic, o.runs, progress, watch)
                if levels != [1]:
                    loaded = concurrency.run_levels(configs, o.traffic, o.runs, levels, progress)
            explained = _explained(configs[: len(arguments.candidates)], configs[-1] if o.baseline else None, o.traffic,
                                   measurements, servers, lifecycle, placed.sequential)
        except PowerError as err:
            refuse(err, o.as_json, at=o.plan)  # exits; the stack stops every server it started, restores the deployment
    control = configs[-1] if o.baseline else None
    host = watch.document()
    if host["busy"]:
        click.echo(f"note: a busy host: {host['reason']}; ratios measured now may not hold on a quiet one", err=True)
    documents = [harness.evidence(config, control, o.traffic, o.runs, o.max_tokens, measurements, placed,
                                  lifecycle.events, host, explained.get(config.label), o.near_tie_margin)
                 for config in configs[: len(arguments.candidates)]]
    if levels != [1]:
        for config, document in zip(configs, documents, strict=False):
            roles = {config.label: harness.CANDIDATE} | ({control.label: harness.BASELINE} if control else {})
            document["concurrency"] = concurrency.section(loaded, roles, levels, [s.name for s in o.traffic],
                                                          arguments.slots)
    best = harness.winner(documents) if control else None
    document = best or documents[0]
    if o.sweeps:
        document["sweep"] = sweep.section(documents, [label for label, _, _ in arguments.candidates], best)
    if o.output is not None:
        with writing(o.output, o.as_json):
            harness.write_evidence(document, o.output)
        click.echo(f"wrote {o.output}", err=True)
    if o.report is not None:
        with writing(o.report, o.as_json):
            write_report(document, o.report)
        click.echo(f"wrote {o.report}", err=True)
    table = text_table(document)
    if o.sweeps:
        table = sweep.table(document["sweep"]) + "\n" + table
    if o.env_path is not None:
        from power.app.bench_env import env_file_text

        with writing(o.env_path, o.as_json):
            write_text_atomic(o.env_path, env_file_text(engine, best, configs, control, table))
        click.echo(f"wrote {o.env_path}", err=True)
    click.echo(json.dumps(document, indent=2, ensure_ascii=False) if o.as_json else table, nl=not o.as_json)
    if any(result["verdict"] == "lossy" for d in documents for result in d["shapes"].values()):
        sys.exit(EXIT_FINDINGS)


def _configs(plans, engine: str, binary: Path | None, device: str, threads: int | None, root: Path | None,
             running: contextlib.ExitStack, lifecycle: Lifecycle, servers: dict, start: bool = True):
    """One configuration per plan, its engine loaded (Power) or, with `start`, started and healthy (live; stopped by
    `running`); the live servers go into `servers` by label, for a run in turns to bring up and take down."""
    from power.app import bench as harness
    from power.app.live import LiveEngine, LiveEngineError
    from power.app.served import ServedEngine
    from power.runtime.engine import Engine, EngineOptions
    from power.runtime.workload import Workload

    configs = []
    for label, path, plan in plans:
        click.echo(f"loading {label}: {path} (mode {plan.mode.resolved}) on {engine}", err=True)
        if engine not in LIVE_ENGINES:  # Power's own runtime, in this process
            options = EngineOptions(device=device, threads=threads)
            runtime_engine = Engine(Workload.of_plan(plan, path, root), options)
            configs.append(harness.BenchConfig(label, Path(path), plan, runtime_engine))
        else:
            if binary is None:
                raise LiveEngineError(f"no {engine} binary to launch", hint="pass --engine-binary PATH")
            server = LiveEngine(engine, plan, Path(path), binary, threads=threads)
            running.callback(_take_down, server, label, lifecycle)
            servers[label] = server
            configs.append(harness.BenchConfig(label, Path(path), plan, ServedEngine(server)))
    if start:
        for label, server in servers.items():  # live servers load side by side, then each must be healthy
            server.start_process()
            lifecycle.event("start", label, port=server.port, pid=_pid(server))
        for label, server in servers.items():
            server.wait_healthy()
            lifecycle.event("healthy", label, port=server.port, pid=_pid(server), load_s=round(server.load_s, 3))
    return configs


def _explained(candidates, control, traffic, measurements, servers: dict, lifecycle: Lifecycle,
               sequential: bool) -> dict[str, dict[str, list]]:
    """Per candidate, per greedy shape whose outputs differ from the baseline's: each run's first divergence,
    replayed through the candidate's own llama-server without speculation (brought up again for it when the run
    went one at a time); on Power's runtime, exact by construction, and on vLLM, only where it happened."""
    from power.app import bench as harness
    from power.app import divergence
    from power.app.live import protocol

    explained: dict[str, dict[str, list]] = {}
    if control is None:
        return explained
    for config in candidates:
        pairs = {shape.name: (shape, harness.receipts_of(measurements, shape.name, config.label),
                              harness.receipts_of(measurements, shape.name, control.label)) for shape in traffic}
        differing = {name: pair for name, pair in pairs.items() if pair[0].temperature == 0.0 and any(
            ours.token_ids != theirs.token_ids for ours, theirs in zip(pair[1], pair[2], strict=True))}
        if not differing:
            continue
        server = servers.get(config.label)
        with contextlib.ExitStack() as turn:
            if server is not None and sequential:
                _bring_up(server, config.label, lifecycle)
                turn.callback(_take_down, server, config.label, lifecycle)
            # the native /completion reads the target's log-probabilities (n_probs); an OpenAI-shaped server is
            # not replayed here, so its divergences stay unexplained, which is lossy (fail closed)
            replay = (partial(divergence.explain, server)
                      if server is not None and protocol(server.engine).native else None)
            explained[config.label] = {name: harness.divergences(ours, theirs, shape, replay)
                                       for name, (shape, ours, theirs) in differing.items()}
    return explained


def _pid(server) -> int | None:
    return server.process.pid if server.process is not None else None


def _bring_up(server, label: str, lifecycle: Lifecycle) -> None:
    """Start one configuration's server on its own and wait until it is healthy (its turn)."""
    click.echo(f"starting {label}", err=True)
    server.start_process()
    lifecycle.event("start", label, port=server.port, pid=_pid(server))
    server.wait_healthy()
    lifecycle.event("healthy", label, port=server.port, pid=_pid(server), load_s=round(server.load_s, 3))


def _take_down(server, label: str, lifecycle: Lifecycle) -> None:
    """Stop the server if it runs (a second call, from the exit stack, finds nothing to stop)."""
    pid = _pid(server)
    if pid is not None:
        server.stop()
        lifecycle.event("stop", label, port=server.port, pid=pid)


def _stand_down(port: int, lifecycle: Lifecycle, running: contextlib.ExitStack) -> None:
    """Stop the deployment's server on `port` (if one runs), its restore registered first on `running`."""
    from power.app import standing

    found = standing.find(port)
    if found is None:
        click.echo(f"deployment port {port}: nothing listens there, so nothing is stopped", err=True)
        lifecycle.event("absent", "deployment", port=port)
        return
    held = standing.hold(found, lifecycle)
    how = f"systemd unit {found.unit}, with systemctl" if found.unit else f"pid {found.pid}"
    click.echo(f"stopping the deployment's server on port {port} ({how}); it is restored when the bench ends", err=True)
    running.callback(_restore, held)
    held.stop()


def _restore(held) -> None:
    """Bring the deployment back; when it cannot be, say so and exit with the usage code (the bench's figures, if
    any, are not worth a deployment left down)."""
    try:
        held.restore()
    except PowerError as err:
        refuse(err)
    if held.restored is not None:
        unit = f"systemd unit {held.server.unit}, " if held.server.unit else ""
        click.echo(f"restored the deployment's server on port {held.server.port} ({unit}pid {held.restored})", err=True)
