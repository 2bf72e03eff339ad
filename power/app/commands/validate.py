"""`power validate PATHS...`: every finding in manifests, profiles, hosts and fleets, at once.

PATHS are files, directories (searched recursively for *.toml, skipping hidden
directories) or globs. Exit 0 when every file is valid (warnings and info
allowed), 1 when any file has an error finding, 2 when a path does not exist or
names no TOML file.
"""

from __future__ import annotations

import glob
import json
import sys
from pathlib import Path

import click

from power.app.cli import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from power.findings import Finding, Severity, has_errors
from power.orchestrator.inputs.loading import Loaded, load_document

_GLOB_CHARACTERS = set("*?[")


@click.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print findings, files and a summary as JSON.")
def validate(paths: tuple[str, ...], as_json: bool) -> None:
    """Validate manifests, profiles, hosts and fleets: every finding at once.

    PATHS are files, directories (searched for *.toml, hidden ones skipped) or
    globs; each file's kind comes from its `schema` key. Example:

        power validate manifests profiles examples/hosts/*.toml

    Exit 0 when every file is valid (warnings and info allowed), 1 on any error
    finding, 2 when a path does not exist or holds no .toml file.
    """
    files, usage_findings = expand_paths(paths)
    documents = [_checked(load_document(path)) for path in files]
    findings = [finding for document in documents for finding in document.findings]
    if as_json:
        click.echo(json.dumps(_report(documents, usage_findings + findings), indent=2))
    else:
        for finding in usage_findings:
            click.echo(finding.render(), err=True)
        for finding in findings:
            click.echo(finding.render())
        click.echo(_summary_line(documents, findings))
    if usage_findings:
        sys.exit(EXIT_USAGE)
    sys.exit(EXIT_FINDINGS if has_errors(findings) else EXIT_OK)


def _checked(document: Loaded) -> Loaded:
    """A fleet is checked as far as its file alone says: each deployment's host and devices exist (PWR060)."""
    if document.kind == "fleet" and document.model is not None:
        from power.orchestrator.fleet.review import fleet_placement_findings

        document.findings += fleet_placement_findings(document)
    return document


def expand_paths(arguments: tuple[str, ...]) -> tuple[list[Path], list[Finding]]:
    """The files named by `arguments`, in order and without repeats, and a finding for each argument that names none."""
    files: list[Path] = []
    problems: list[Finding] = []
    for argument in arguments:
        found = _files_for(argument)
        if found is None:
            problems.append(_usage_finding("PWR001", argument, "no such file or directory", "check the path"))
        elif not found:
            problems.append(
                _usage_finding("PWR009", argument, "holds no .toml file", "name a .toml file, or a "
                                                                          "directory that contains some")
            )
        files += [path for path in found or [] if path not in files]
    return files, problems


def _files_for(argument: str) -> list[Path] | None:
    path = Path(argument)
    if path.is_dir():
        return _toml_under(path)
    if path.exists() or path.is_symlink():
        return [path]
    if _GLOB_CHARACTERS & set(argument):
        matches = [Path(match) for match in sorted(glob.glob(argument, recursive=True))]
        return [file for match in matches for file in (_toml_under(match) if match.is_dir() else [match])]
    return None


def _toml_under(directory: Path) -> list[Path]:
    return [
        path
        for path in sorted(directory.rglob("*.toml"))
        if not any(part.startswith(".") for part in path.relative_to(directory).parts)
    ]


def _usage_finding(code: str, argument: str, message: str, hint: str) -> Finding:
    return Finding(code=code, severity=Severity.ERROR, message=message, file=argument, hint=hint)


def _counts(findings: list[Finding]) -> dict[str, int]:
    return {severity.value: sum(f.severity is severity for f in findings) for severity in Severity}


def _summary_line(documents: list[Loaded], findings: list[Finding]) -> str:
    counts = _counts(findings)
    files = f"{len(documents)} file{'s' * (len(documents) != 1)}"
    tally = (f"{counts['error']} error{'s' * (counts['error'] != 1)}, "
             f"{counts['warning']} warning{'s' * (counts['warning'] != 1)}, {counts['info']} info")
    if counts["error"]:
        return f"{tally} in {files}"
    return f"{files} valid ({tally})" if findings else f"{files} valid"


def _report(documents: list[Loaded], findings: list[Finding]) -> dict:
    counts = _counts(findings)
    return {
        "findings": [finding.to_json() for finding in findings],
        "files": [
            {"file": str(document.path), "kind": document.kind, "valid": not has_errors(document.findings)}
            for document in documents
        ],
        "summary": {
            "files": len(documents),
            "errors": counts["error"],
            "warnings": counts["warning"],
            "info": counts["info"],
            "valid": not has_errors(findings),
        },
    }
