"""`power drafter distill MANIFEST --kind mtp|dflash|dflash2|dspark -o DIR`: train a drafter for the manifest's
target on this machine."""

from __future__ import annotations

import time
from pathlib import Path

import click

from power.app.arguments.distill import parse_distill
from power.app.cli import EXIT_FINDINGS, EXIT_USAGE, print_findings, refuse
from power.app.outputs import owned_folder
from power.artifacts.atomic import write_text_atomic
from power.findings import PowerError, has_errors
from power.orchestrator.inputs.schema import Manifest

DISTILL_MARKER = ".power-distill"  # in a folder distill wrote: a rerun may write over it (and resume from it)


def verified_inputs(manifest: Manifest, folder: Path) -> str:
    """The target's sha256, after the target and every drafter file the manifest names are checked against their
    pinned size and sha256 in full (ArtifactError PWR110, PWR115): distill trains on, and pins in the manifest it
    writes, only the file the manifest pinned."""
    from power.artifacts.verify import TARGET, Artifact, verified_sha256

    target = manifest.target
    for drafter in manifest.drafters:
        if drafter.path is not None:
            verified_sha256(Artifact(drafter.kind, folder / drafter.path, drafter.sha256, drafter.size))
    return verified_sha256(Artifact(TARGET, folder / target.path, target.sha256, target.size))


@click.group("drafter")
def drafter() -> None:
    """Build drafters for a target."""


@drafter.command("distill")
@click.argument("manifest", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--kind", type=click.Choice(["mtp", "dflash", "dflash2", "dspark"]), required=True,
              help="The drafter's kind (its contract: docs/contracts.md); mtp: a Gemma 3 target's MTP-only sidecar "
                   "(PWR219 for another architecture).")
@click.option("--fr", type=click.IntRange(min=1), default=None,
              help="The head drafts over the N token IDs the target chose most often in the training text (the "
                   "drafter's draft vocabulary, written into its GGUF); default: every ID.")
@click.option("--budget", default="20m", show_default=True, help="Wall time for the whole run: 20m, 90s, 1.5h.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--prompts", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Prompts the target continues (JSON lines with a `prompt`, or one per line); "
                   "default: the packaged set.")
@click.option("--corpus", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Text the target reads at prefill speed (paragraphs, or JSON lines with a `text`).")
@click.option("--corpus-share", type=click.FloatRange(0, 1), default=0.5, show_default=True,
              help="With --corpus: the share of the data time the corpus gets; the target writes its own text in the "
                   "rest (docs/drafters.md measures the mix).")
@click.option("--max-prompts", type=click.IntRange(min=1), default=None, help="Use the first N prompts only.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="Tokens the target writes per prompt.")
@click.option("--slots", type=click.IntRange(min=1, max=64), default=8, show_default=True,
              help="Prompts generated side by side (one forward per step for all of them).")
@click.option("--steps", type=click.IntRange(min=1), default=100_000, show_default=True,
              help="The most training steps (the budget usually ends training first).")
@click.option("--chain-levels", type=click.IntRange(min=1, max=10), default=3, show_default=True,
              help="mtp: chain steps trained at once (step s + 1 reads the head's own output of step s).")
@click.option("--precision", type=click.Choice(["auto", "float32", "bfloat16"]), default="auto", show_default=True,
              help="Training's products: auto takes bfloat16 on a CPU that multiplies it natively (AVX512-BF16, AMX), "
                   "else float32; weights and the acceptance measurement stay float32.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="torch threads (default: torch's).")
@click.option("-o", "--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Where the drafter GGUF, manifest.toml, profile.toml and distill.json go (resume/ keeps "
                   "the resumable state).")
@click.option("--quiet", is_flag=True, help="No progress bars.")
def distill(manifest: Path, kind: str, fr: int | None, budget: str, seed: int, prompts: Path | None,
            corpus: Path | None, corpus_share: float, max_prompts: int | None, max_new_tokens: int, slots: int,
            steps: int, chain_levels: int, precision: str, threads: int | None, out: Path, quiet: bool) -> None:
    """Distil a drafter from the target's own greedy text (and an optional corpus) on this machine.

    A rerun with the same DIR resumes: the generated rows and the training
    checkpoint are kept in DIR/resume/. DIR must be new, empty, or one an
    earlier distill wrote; the target and any drafter file the manifest names
    must match their pinned sha256. Exit codes: 0 ok, 1 the manifest has
    errors, 2 usage error (or an input that is not what the manifest pinned).
    """
    began = time.monotonic()  # the budget holds the whole run, the inputs' verification included
    from power.orchestrator.inputs.loading import load_manifest

    arguments = parse_distill(manifest, out, kind, fr, budget, seed, prompts, corpus, corpus_share, max_prompts,
                              max_new_tokens, slots, steps, chain_levels, precision, threads, quiet)
    loaded = load_manifest(manifest)
    if not loaded.ok:
        print_findings(loaded.findings, as_json=False)
        raise SystemExit(EXIT_FINDINGS if has_errors(loaded.findings) else EXIT_USAGE)
    import torch

    from power.drafters.distill import distill as run_distill
    from power.drafters.distill import recipe
    from power.drafters.export import report as write_report
    from power.orchestrator.planning.worth_it import judge_distilled  # imported inside the budget, used after it
    from power.runtime.gguf_weights import GGUFFile

    target = manifest.parent / loaded.model.target.path
    try:
        owned_folder(out, DISTILL_MARKER, "distill")
        target_sha256 = verified_inputs(loaded.model, manifest.parent)
        request = arguments.request(target, target_sha256, began)
        recipe(request, GGUFFile(target))  # a kind this target cannot have is refused before anything is written
    except PowerError as err:
        refuse(err, at=manifest)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    if arguments.threads:
        torch.set_num_threads(arguments.threads)
    write_text_atomic(out / DISTILL_MARKER, "written by power drafter distill: a rerun may write over this folder\n")
    try:
        result = run_distill(request)
    except PowerError as err:
        refuse(err, at=manifest)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    acceptance = result.report["acceptance"]
    click.echo(f"wrote {result.drafter}, {result.manifest}, {result.profile}")
    click.echo(f"{result.report['tokens']} tokens, {result.report['steps']} steps; held-back acceptance per position "
               f"{acceptance['per_position']}, mean accepted at K=7 {acceptance['mean_accepted'].get('7')}")
    if result.report["served"] is not None:
        figures = result.report["served"]["per_k"]
        click.echo("tokens a round, training's estimate from the held-back per-position accuracies against the "
                   f"runtime's drafter served over {result.report['served']['sequences']} of "
                   f"{result.report['served']['offered']} held-back sequences (the budget's): "
                   + ", ".join(f"K{k} {f['estimate']:.2f} / {f['served']:.2f}" for k, f in figures.items()))
    k = result.report["recommended"]["k"]
    worth = judge_distilled(result.report["round_costs"], kind, k,
                            result.report["acceptance"]["mean_accepted"][str(k)]).document()
    write_report(out / "distill.json", result.report | {"worth_it": worth})
    even = worth["break_even_p"]
    click.echo(f"worth-it at K{worth['k']}: the held-back acceptance (p = {worth['p']:.2f}) decodes at "
               f"{worth['speedup']:.2f}x target-only on this machine (target step "
               f"{worth['target_step_s'] * 1e3:.1f} ms, verification {worth['verify_cost']:.2f} steps, drafting "
               f"{worth['draft_step_s'] * 1e3:.1f} ms; break-even p = "
               f"{'none: not even p = 1' if even is None else f'{even:.2f}'})")
    if not worth["beats_target_only"]:
        click.echo("this drafter cannot beat target-only here, so no plan is suggested: train it longer (--budget) "
                   "or on text like the traffic it will serve (--corpus)")
        return
    plan = out / "plan.json"
    click.echo(f"next: power plan {result.manifest} {result.profile} --device \"8 GiB\" -o {plan}")
    click.echo(f"then measure it on held-out text: power bench {plan} --shapes writing,code,chat (the estimate above "
               "is priced, not measured: a plan that decodes under 0.98x its target's own rate in its engine is "
               "named there as below target-only)")
