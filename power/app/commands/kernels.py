"""`power kernels build|status`: the CPU kernels compiled ahead of time, and what the kernel cache holds."""

from __future__ import annotations

import json
import time

import click

from power.app.cli import EXIT_FINDINGS, print_findings, refuse
from power.runtime.errors import kernel_refusal


@click.group("kernels")
def kernels() -> None:
    """Build the CPU kernels ahead of time (so a serving host needs no compiler), or show the kernel cache."""


@kernels.command("build")
@click.option("--path", "paths", multiple=True, metavar="NAME",
              help="An instruction path to build (repeatable), whether or not this CPU runs it (for a cache other "
                   "hosts will use); default: the one this CPU runs (POWER_CPU_PATH or the best it has).")
@click.option("--all", "every", is_flag=True, help="Every instruction path this CPU can run.")
@click.option("--force", is_flag=True, help="Build again, replacing what the cache holds (e.g. a refused build).")
@click.option("--verbose", is_flag=True, help="Show the compiler's commands and messages.")
def build(paths: tuple[str, ...], every: bool, force: bool, verbose: bool) -> None:
    """Compile the CPU kernels into the kernel cache ($POWER_KERNEL_CACHE, else the user cache directory) and
    check them as a run would load them. Exit 2 when a path cannot be built or the cache cannot be used."""
    from power.kernels.cpu import build as kernel_build
    from power.kernels.cpu import cache

    if every and paths:
        raise click.UsageError("give --path NAME or --all, not both")
    try:
        names = kernel_build.available_paths() if every else (paths or (kernel_build.chosen_path(),))
        runs_here = kernel_build.available_paths()
        for name in names:
            started = time.monotonic()
            kernel_build.build(name, force=force, verbose=verbose)
            library = cache.verify(name, kernel_build.build_key(name), kernel_build.namespace_of(name))
            note = "" if name in runs_here else ", not run on this CPU"
            click.echo(f"{name}: {library} ({time.monotonic() - started:.1f} s{note})")
    except cache.KernelError as error:
        refuse(kernel_refusal(error))


@kernels.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def status(as_json: bool) -> None:
    """Each instruction path: whether this CPU runs it, and whether the cache holds a build that loads
    (checked by digest, owner and mode, as a run checks it). Exit 1 when the chosen path is not ready."""
    from power.kernels.cpu import build as kernel_build
    from power.kernels.cpu import cache

    try:
        chosen = kernel_build.chosen_path()
    except cache.KernelError as error:
        refuse(kernel_refusal(error), as_json)
    available = kernel_build.available_paths()
    rows, findings = [], []
    for name in kernel_build.PATH_NAMES:
        key = kernel_build.build_key(name)
        row: dict = {"path": name, "chosen": name == chosen, "runs_here": name in available, "key": key,
                     "folder": str(cache.folder_of(name, key)), "built": False}
        if cache.built(name, key) is not None:
            try:
                cache.verify(name, key, kernel_build.namespace_of(name))
                row["built"] = True
            except cache.KernelError as error:
                finding = kernel_refusal(error).finding
                row["refused"] = finding.message
                findings.append(finding)
        rows.append(row)
    ready = next(row for row in rows if row["chosen"])["built"]
    if as_json:
        click.echo(json.dumps({"cache": str(cache.root()), "chosen": chosen, "ready": ready, "paths": rows,
                               "findings": [f.to_json() for f in findings]}, indent=2))
    else:
        click.echo(f"kernel cache: {cache.root()}")
        for row in rows:
            state = "built" if row["built"] else ("REFUSED" if "refused" in row else "not built")
            runs = "runs here" if row["runs_here"] else "not on this CPU"
            click.echo(f"  {'*' if row['chosen'] else ' '} {row['path']:<11} {runs:<16} {state}")
        print_findings(findings, as_json=False)
        if not ready:
            click.echo(f"the {chosen} kernels are not built: `power kernels build` compiles them now "
                       f"(a first run would)", err=True)
    if not ready:
        raise SystemExit(EXIT_FINDINGS)
