"""`power bench PLAN [--vs PLAN2] [--engine ...] [--sweep ...]`: the A/B protocol -> a per-shape table, evidence,
a report, and the winner as a deployment env file."""

from __future__ import annotations

from pathlib import Path

import click

from power.app.arguments.bench import parse_bench, resolve_bench
from power.app.arguments.runtime_options import runtime_options
from power.app.bench.divergence import DEFAULT_MARGIN
from power.app.bench.traffic import DEFAULT_SHAPES
from power.app.commands.artifact_root import root_option
from power.orchestrator.engines import ENGINES


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
@click.option("--governor", type=click.Choice(["on", "off"]), default="on", show_default=True,
              help="Power's runtime only: off measures each speculator's own rate, every round it can draft (as "
              "llama-server and vLLM run, which have no cost governor); on, as a deployment runs. The evidence's "
              "engine records which.")
@runtime_options
@root_option
@click.option("--json", "as_json", is_flag=True, help="Print the evidence document instead of the table.")
def bench(plan: Path, baseline: Path | None, engine: str, engine_binary: Path | None, shapes: str, runs: int,
          max_tokens: int, prompt_tokens: int | None, sweeps: tuple[str, ...], output: Path | None, report: Path | None,
          env_path: Path | None, one_at_a_time: bool, deployment_port: int | None, concurrency_text: str,
          near_tie_margin: float, governor: str, device: str, threads: int | None, root: Path | None,
          as_json: bool) -> None:
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
                                          deployment_port, concurrency_text, near_tie_margin, governor == "on",
                                          device, threads, root, as_json))
    from power.app.bench import workflow

    workflow.run(arguments)

