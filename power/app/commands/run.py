"""`power run PLAN --prompt TEXT --max-tokens N [--json]`: generate with the Power runtime and print the receipt."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from power.app.arguments.runtime_options import greedy_head_option, refuse_unusable_device, runtime_options
from power.app.cli import refuse
from power.app.commands.artifact_root import root_option
from power.app.outputs import require_outputs, writing
from power.findings import PowerError
from power.orchestrator.inputs.schema import MAX_CTX, MAX_ROWS


@click.command("run")
@click.argument("plan", required=False, type=click.Path(path_type=Path))
@click.option("--gguf", type=click.Path(path_type=Path),
              help="Run this GGUF directly, without a plan: plain greedy decoding (for quick checks and tests).")
@click.option("--prompt", required=True, help="The prompt text, tokenised as text: `<eos>` or a "
                                               "template's markers in it are not control tokens (BOS is added when the "
                                               "model's header asks).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--stop", "stops", multiple=True,
              help="End the generation at this text (repeatable); the text and receipt end before it, the receipt "
                   "says `stop`.")
@click.option("--ctx", type=click.IntRange(min=2, max=MAX_CTX), default=None,
              help="With --gguf: the context in positions (default 2048). A plan fixes its own.")
@click.option("--verify-capacity", type=click.IntRange(min=1, max=MAX_ROWS), default=None,
              help="With --gguf: the fixed forward shape in rows (default 1). A plan fixes its own.")
@runtime_options
@greedy_head_option
@root_option
@click.option("--receipt", "receipt_path", type=click.Path(path_type=Path), default=None,
              help="Also write the receipt JSON to this file (atomically).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (the receipt, with the text) "
                                                      "instead of streaming.")
def run(plan: Path | None, gguf: Path | None, prompt: str, max_tokens: int, stops: tuple[str, ...], ctx: int | None,
        verify_capacity: int | None, device: str, threads: int | None, greedy_head: bool,
        root: Path | None, receipt_path: Path | None, as_json: bool) -> None:
    """Generate with the Power runtime (on a GPU when torch sees one); stream the text, then report the receipt.

    Give a resolved PLAN (from `power plan`: its mode, drafters, K/S, shapes,
    arithmetic and sampling apply), or `--gguf FILE` for a direct plain run of a
    model in a default plan's arithmetic (quantised) and KV cache type (f16). Exit
    codes: 0 ok, 2 usage or input error (unimplemented architecture, missing or
    mis-shaped tensor, unsupported quant type, a prompt longer than the context,
    a plan that does not load, an artifact that is not the planned file, a declined speculator).
    Every artifact the plan names is hashed in full before anything loads.
    """
    if (plan is None) == (gguf is None):
        raise click.UsageError("give exactly one of PLAN or --gguf FILE")
    if plan is not None and (ctx is not None or verify_capacity is not None):
        raise click.UsageError("--ctx and --verify-capacity are fixed by the plan; change the "
                               "profile and re-plan instead")
    if gguf is not None and root is not None:
        raise click.UsageError("--root locates a plan's artifacts; with --gguf, give the file's path")
    require_outputs(files=(receipt_path,), as_json=as_json)
    resolved = _plan(plan, as_json)  # an edited or unreadable plan is refused before the runtime is imported
    refuse_unusable_device(device, as_json)
    from power.runtime.engine import EngineOptions

    streamed = False

    def stream(piece: str) -> None:
        nonlocal streamed
        streamed = True
        sys.stdout.write(piece)
        sys.stdout.flush()

    try:
        options = EngineOptions(device=device, threads=threads, greedy_head=greedy_head)
        engine = _engine(plan, resolved, gguf, ctx, verify_capacity, root, options)
        receipt = engine.generate(_as_text(engine, prompt), max_tokens, None if as_json else stream, stop=stops)
    except PowerError as err:
        if streamed:
            click.echo("\n(the text above is incomplete)", err=True)
        refuse(err, as_json, at=plan)
    if as_json:
        click.echo(receipt.to_json(), nl=False)
    else:
        click.echo()
        sys.stdout.flush()
        click.echo(receipt.summary(), err=True)
    if receipt_path is not None:
        # After the output: a receipt that cannot be written never costs the generation (its finding is on stderr).
        with writing(receipt_path):
            receipt.save(receipt_path)


def _as_text(engine, prompt: str) -> str:
    """The prompt as text: its control-token texts (`<eos>`, a template's markers) are not control tokens."""
    from power.runtime.errors import RuntimeInputError

    try:
        return engine.tokenizer.as_text(prompt)
    except ValueError as err:
        raise RuntimeInputError(f"the prompt cannot be read as text: {err}", hint="remove that character") from None


def _plan(plan: Path | None, as_json: bool):
    """The resolved plan at `plan` (None with --gguf); refused here when it cannot be used."""
    from power.documents.plan import load_plan

    if plan is None:
        return None
    try:
        return load_plan(plan)
    except PowerError as err:
        refuse(err, as_json, at=plan)


def _engine(plan: Path | None, resolved, gguf: Path | None, ctx: int | None, verify_capacity: int | None,
            root: Path | None, options):
    from power.runtime.engine import Engine
    from power.runtime.workload import DEFAULT_CTX, Workload

    if plan is not None:
        return Engine(Workload.of_plan(resolved, plan, root), options)
    assert gguf is not None  # run() takes exactly one of them
    return Engine(Workload.of_gguf(gguf, ctx or DEFAULT_CTX, verify_capacity or 1), options)
