"""`power pull MANIFEST|PLAN [-o DIR] [--pin] [--json]`: fetch every artifact a manifest (or a sealed plan) names
from where it is published, checked before it is placed (`power.artifacts.pull`). A plan carries each artifact's
source, size and sha256 under its seal, so a pod's init container pulls from the plan it runs, then verifies it.

Each artifact already in place with the declared size and sha256 is left alone; any other is fetched from its
`source` (a Hugging Face repository at a commit, or an HTTPS URL), its size and sha256 checked over every byte
(and, from the Hub, against the Hub's own sha256 of the LFS file), and only then renamed into place. A file that
fails a check is deleted and the command exits 1 with a finding naming the file and both digests. `--pin`
resolves branch or tag revisions to their commits and writes each commit, size and sha256 into the manifest,
showing the change. Exit codes: 0 every artifact in place, 1 a finding, 2 usage error.
"""

from __future__ import annotations

import difflib
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

import click

from power.app.cli import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, print_findings, refuse
from power.artifacts.atomic import write_text_atomic
from power.artifacts.pull.errors import PullError
from power.artifacts.pull.place import Pulled, Wanted
from power.artifacts.pull.place import pull as pull_one
from power.documents.plan import Drafter, PlanError, ResolvedPlan, Target, load_plan, located
from power.findings import Finding, Severity, has_errors
from power.orchestrator.inputs.loading import Loaded, load_manifest
from power.orchestrator.inputs.pin import pinned
from power.orchestrator.inputs.schema import DrafterEntry, Manifest, TargetEntry

NOT_A_PLAN = "PWR080"
PIN_FIXES = frozenset({"PWR131", "PWR132"})  # what `--pin` writes, so a manifest refused for them can still be pinned


@click.command("pull")
@click.argument("document_path", metavar="MANIFEST|PLAN", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              metavar="DIR", help="Place every artifact in DIR by its file name (where a container mounts the "
              "models; as `power verify --root DIR` looks for them) instead of at the paths the file names.")
@click.option("--pin", is_flag=True, help="Resolve each revision to its commit and write commits, sizes and sha256 "
              "digests into the manifest (a lock), showing the change.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: each artifact, the findings.")
def pull(document_path: Path, out_dir: Path | None, pin: bool, as_json: bool) -> None:
    """Fetch the artifacts a MANIFEST (or a sealed PLAN) names from their sources, each checked by size and sha256
    before it is placed.

    Exit codes: 0 every artifact in place, 1 a finding (nothing half-written is left), 2 usage error.
    """
    plan = _plan(document_path, as_json)
    if plan is not None:
        if pin:
            raise click.UsageError("--pin writes commits and digests into a manifest, and a plan is sealed: pin the "
                                   "manifest, then re-plan")
        pulled, findings = _pull_each(_wanted_from_plan(located(plan, document_path), out_dir), document_path)
        _end(document_path, pulled, findings, as_json)
    loaded = load_manifest(document_path)
    model, findings = _manifest(loaded, pin)
    if model is None:
        _end(loaded.path, [], findings, as_json)
    pulled, failed = _pull_each(_wanted_from_manifest(model, out_dir), loaded.path, loaded)
    findings += failed
    if pin and not has_errors(findings):
        findings += _pin(loaded, pulled)
    _end(loaded.path, pulled, findings, as_json)


def _plan(path: Path, as_json: bool) -> ResolvedPlan | None:
    """The sealed plan at `path`, or None when the file is no plan (a manifest, or nothing: the manifest loader
    names what it is); a broken JSON plan is refused."""
    try:
        return load_plan(path)
    except PlanError as err:
        if err.finding.code == NOT_A_PLAN and path.suffix != ".json":
            return None
        refuse(err, as_json)


def _pull_each(wanted: list[Wanted], at: Path, loaded: Loaded | None = None) -> tuple[list[Pulled], list[Finding]]:
    """Each artifact pulled in turn; a refusal is a finding at the manifest key (given the manifest), else in `at`."""
    pulled: list[Pulled] = []
    findings: list[Finding] = []
    for each in wanted:
        try:
            pulled.append(pull_one(each))
        except PullError as err:
            found = err.finding
            where = found.where or f"{each.where}.source"
            findings.append(loaded.finding(found.code, found.message, where=where, hint=found.hint)
                            if loaded is not None else replace(found, where=where, file=found.file or str(at)))
    return pulled, findings


def _manifest(loaded: Loaded, pin: bool) -> tuple[Manifest | None, list[Finding]]:
    """The manifest's model; with --pin, also when its only errors are the ones pinning fixes."""
    findings = list(loaded.findings)
    if loaded.ok:
        return loaded.model, findings
    errors = {f.code for f in findings if f.is_error}
    if not pin or not errors or not errors <= PIN_FIXES or loaded.data is None:
        return None, findings
    model = Manifest.model_validate(loaded.data, context={"base_dir": loaded.path.absolute().parent})
    return model, [f for f in findings if f.code not in PIN_FIXES]


def _wanted_from_plan(plan: ResolvedPlan, out_dir: Path | None) -> list[Wanted]:
    return _wanted([("target", plan.target), *((f"drafters[{i}]", d) for i, d in enumerate(plan.drafters))], out_dir)


def _wanted_from_manifest(model: Manifest, out_dir: Path | None) -> list[Wanted]:
    return _wanted([("target", model.target), *((f"drafters[{i}]", d) for i, d in enumerate(model.drafters))],
                   out_dir)


def _wanted(entries: Sequence[tuple[str, Target | Drafter | TargetEntry | DrafterEntry]],
            out_dir: Path | None) -> list[Wanted]:
    """Each artifact with a file: where it goes (DIR by its file name, else its own path) and what it must be."""
    wanted = []
    for where, entry in entries:
        if entry.path is None:
            continue
        source = entry.source
        path = Path(entry.path) if out_dir is None else out_dir.absolute() / Path(entry.path).name
        hub = {"repo": source.repo, "revision": source.revision} if source else {}
        files = getattr(entry, "files", None)  # a target has none
        if files is not None:  # a checkpoint folder: each of its files, by its path in the repository
            wanted += [Wanted(f"{where}.files[{number}]", path / file.name, file.size, file.sha256, source_at=where,
                              filename=file.name, **hub) for number, file in enumerate(files)]
            continue
        wanted.append(Wanted(where, path, entry.size, entry.sha256, filename=source.filename if source else None,
                             url=source.url if source else None, **hub))
    return wanted


def _pin(loaded: Loaded, pulled: list[Pulled]) -> list[Finding]:
    """The manifest rewritten with commits, sizes and digests; the change shown as a diff on stderr."""
    before = loaded.text or ""
    after = pinned(before, pulled)
    if after == before:
        return []
    diff = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                str(loaded.path), f"{loaded.path} (pinned)")
    click.echo("".join(diff), err=True, nl=False)
    write_text_atomic(loaded.path, after)
    return [Finding("PWR139", Severity.INFO, f"pinned {len(pulled)} artifact(s): commits, sizes and sha256 written",
                    file=str(loaded.path), hint="commit the manifest: a later pull fetches exactly these bytes")]


def _end(path: Path, pulled: list[Pulled], findings: list[Finding], as_json: bool) -> NoReturn:
    if as_json:
        click.echo(json.dumps({"file": str(path), "artifacts": [
            {"where": p.wanted.where, "path": str(p.wanted.path), "size": p.size, "sha256": p.sha256,
             "fetched": p.fetched, "from": p.origin} for p in pulled], "findings": [f.to_json() for f in findings]},
            indent=2))
    else:
        for p in pulled:
            how = f"pulled from {p.origin}" if p.fetched else "already in place"
            click.echo(f"ok  {p.wanted.where}: {p.wanted.path} ({p.size:,} bytes, sha256 {p.sha256}), {how}")
    print_findings(findings, as_json=False)
    if any(f.code == "PWR001" for f in findings):
        sys.exit(EXIT_USAGE)
    sys.exit(EXIT_FINDINGS if has_errors(findings) else EXIT_OK)
