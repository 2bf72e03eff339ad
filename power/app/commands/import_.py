"""`power import llama-server|vllm [-- ARGV] [--env-file F] [--unit F]`: review an existing launch, convert it.

The launch is read from the command line after `--`, an env file, or a systemd
unit (its Environment=, EnvironmentFile= and ExecStart= lines). Every known
launch-line mistake is a finding located at the flag. With `-o DIR`, a launch
that reads without errors becomes DIR/manifest.toml + DIR/profile.toml, which
are first loaded and checked like any Power file; with `--device SIZE` (repeated for several devices) or
`--host HOST` (its devices) they are also compiled into a plan (artifact digests and kinds,
binding, tokenizer, sizing). The files are checked in a scratch folder beside
DIR and moved into DIR only when no check found an error: any error finding
writes nothing. Exit codes: 0 clean, 1 error findings, 2 usage or input error.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import click
import tomli_w

from power.app.arguments.placement import DeviceSize, host_from_options
from power.app.cli import EXIT_FINDINGS, EXIT_OK, refuse
from power.app.outputs import require_outputs
from power.artifacts import gguf_reader
from power.artifacts.atomic import write_text_atomic
from power.artifacts.bounded_reader import is_regular_file
from power.artifacts.digests import sha256_file
from power.artifacts.facts import ArtifactError, inspect_artifact
from power.documents.plan import ResolvedPlan
from power.findings import Finding, Severity, has_errors
from power.orchestrator.engines import IMPORTABLE
from power.orchestrator.inputs.launch_lines.spec import LaunchSpec
from power.orchestrator.inputs.launch_lines.tokens import (
    LaunchInputError,
    Token,
    tokens_from_argv,
    tokens_from_env_file,
    tokens_from_systemd_unit,
)
from power.orchestrator.inputs.loading import Loaded, load_manifest, load_profile
from power.orchestrator.inputs.units import format_size
from power.orchestrator.launch.importer import (
    env_names,
    import_launch,
    manifest_document,
    on_the_line,
    profile_document,
)
from power.orchestrator.planning.compile import compile_plan


@click.group(name="import")
def import_() -> None:
    """Turn an existing llama-server or vLLM launch line into manifest + profile and check it."""


def _engine_command(engine: str):
    @click.argument("argv", nargs=-1, type=click.UNPROCESSED)
    @click.option("--env-file", type=click.Path(path_type=Path), help="Read the launch from an env file.")
    @click.option("--unit", type=click.Path(path_type=Path), help="Read the launch from a systemd unit.")
    @click.option("-o", "--output", type=click.Path(path_type=Path, file_okay=False),
                  help="Write manifest.toml and profile.toml into this directory.")
    @click.option("--device", "sizes", type=DeviceSize(), multiple=True,
                  help='With -o: also compile the plan for a device of this size, e.g. "24 GiB" (repeat it for '
                       'several, as the line\'s -ts and --spec-draft-device count them).')
    @click.option("--host", "host_path", type=click.Path(path_type=Path, exists=True, dir_okay=False),
                  help="With -o: also compile the plan for this host file's devices (llama-server uses every device "
                       "it sees).")
    @click.option("--json", "as_json", is_flag=True, help="Print the findings and the documents as JSON.")
    def command(argv: tuple[str, ...], env_file: Path | None, unit: Path | None, output: Path | None,
                sizes: tuple[int, ...], host_path: Path | None, as_json: bool) -> None:
        if output is None and (sizes or host_path is not None):
            raise click.UsageError("--device and --host compile the written files: give -o DIR as well")
        require_outputs(directories=(output,), as_json=as_json)
        try:
            tokens = _tokens(engine, list(argv), env_file, unit)
        except LaunchInputError as err:
            refuse(err, as_json)
        result = import_launch(engine, tokens)
        findings = list(result.findings) + _not_gguf(result.spec)
        documents: dict[str, Any] = {}
        if output is not None and not has_errors(findings):
            findings += _missing_files(result.spec)
        if output is not None and not has_errors(findings):
            documents, checked = _checked_documents(result.spec, output, host_path, sizes, engine)
            findings += [f for f in checked if f not in findings]
        _report(findings, documents, as_json)
        sys.exit(EXIT_FINDINGS if has_errors(findings) else EXIT_OK)

    command.__doc__ = f"Review a {engine} launch (after `--`, or --env-file / --unit) and convert it."
    return click.command(name=engine)(command)


for _engine in IMPORTABLE:
    import_.add_command(_engine_command(_engine))


def _tokens(engine: str, argv: list[str], env_file: Path | None, unit: Path | None) -> list[Token]:
    sources = [source for source in (argv, env_file, unit) if source]
    if len(sources) != 1:
        raise LaunchInputError("give the launch one way: after `--`, or --env-file FILE, or --unit FILE")
    if env_file is not None:
        return tokens_from_env_file(env_file, env_names(engine))
    if unit is not None:
        return tokens_from_systemd_unit(unit, env_names(engine))
    return tokens_from_argv(argv)


def _missing_files(spec: LaunchSpec) -> list[Finding]:
    """Writing a manifest needs the model files on this machine: each one that is not here is a finding at its flag."""
    checkpoint = spec.draft_model is not None and Path(spec.draft_model.text).is_dir()  # a drafter's checkpoint folder
    return [_at(token, f"{token.text} is not a file on this machine, so its size and sha256 cannot be recorded")
            for token in (spec.model, None if checkpoint else spec.draft_model)
            if token is not None and not is_regular_file(token.text)]


def _not_gguf(spec: LaunchSpec) -> list[Finding]:
    """A model file that is here but is no GGUF (`-m /etc/passwd`): its reader's finding, at the flag that names it."""
    findings = []
    for token in (spec.model, spec.draft_model):
        if token is None or not is_regular_file(token.text):
            continue
        try:
            gguf_reader.read_header(token.text)
        except ArtifactError as err:
            findings.append(dataclasses.replace(_at(token, f"{token.text}: {err.finding.message}"),
                                                code=err.finding.code,
                                                hint=err.finding.hint))
    return findings


def _at(token: Token, message: str) -> Finding:
    return Finding(code="PWR458", severity=Severity.ERROR, message=message, file=token.file, line=token.line,
                   col=token.col, source_line=token.source_line,
                   hint="run the import on the machine that holds the files, or pass their local paths")


def _checked_documents(spec: LaunchSpec, output: Path, host_path: Path | None, sizes: tuple[int, ...],
                       engine: str) -> tuple[dict, list[Finding]]:
    """Write manifest and profile into a scratch folder beside `output`, check (and compile) them there, and move
    them into `output` only when nothing found an error; the documents and every finding come back."""
    parent = output.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{output.name}.import-", dir=parent))
    try:
        documents, written = _write(spec, scratch)
        findings = [f for loaded in written for f in loaded.findings]
        if not has_errors(findings) and (sizes or host_path is not None):
            plan, compiled = _compile(*written, host_path, sizes, engine)
            findings += [f for f in compiled if f not in findings]
            documents["plan"] = _plan_summary(plan) if plan else None
        if not has_errors(findings):
            output.mkdir(parents=True, exist_ok=True)
            for name in ("manifest.toml", "profile.toml"):
                os.replace(scratch / name, output / name)
            return documents, [_moved(f, scratch, output) for f in findings]
        return {}, [on_the_line(f, spec) if _about(f, scratch) else f for f in findings]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _about(finding: Finding, scratch: Path) -> bool:
    """Whether the finding is about a document written into `scratch`."""
    return bool(finding.file and finding.file.startswith(str(scratch)))


def _moved(finding: Finding, scratch: Path, output: Path) -> Finding:
    """A finding about a scratch file names the file it is (or would have been) in `output`."""
    if finding.file and finding.file.startswith(str(scratch)):
        return dataclasses.replace(finding, file=str(output / Path(finding.file).relative_to(scratch)))
    return finding


def _write(spec: LaunchSpec, folder: Path) -> tuple[dict, tuple[Loaded, Loaded]]:
    """The documents, written into `folder` and loaded back (manifest, profile)."""
    if spec.ctx is None:
        spec.ctx = _model_context(spec)
    documents = {"manifest": manifest_document(spec, folder.absolute(), sha256_file), "profile": profile_document(spec)}
    for kind in ("manifest", "profile"):
        write_text_atomic(folder / f"{kind}.toml", tomli_w.dumps(documents[kind]))
    return documents, (load_manifest(folder / "manifest.toml"), load_profile(folder / "profile.toml"))


def _model_context(spec: LaunchSpec) -> int | None:
    """Without -c, llama-server runs the model's trained context (`-c 0`): read it from the header."""
    if spec.model is None:
        return None
    try:
        context = inspect_artifact(Path(spec.model.text)).hparam("context_length")
    except ArtifactError:
        return None
    return context if isinstance(context, int) and context > 0 else None


def _compile(manifest: Loaded, profile: Loaded, host_path: Path | None, sizes: tuple[int, ...], engine: str):
    """The written files compiled for the engine the launch line runs (its allocation is what must fit), on every
    device of the host: llama-server spreads over every device it sees."""
    host, findings = host_from_options(host_path, sizes)
    if host is None:
        return None, findings
    compiled, found = compile_plan(manifest, profile, host, tuple(range(len(host.devices))), engine=engine)
    return compiled, findings + found


def _plan_summary(plan: ResolvedPlan) -> dict:
    return {"digest": plan.digest, "device": ", ".join(d.name for d in plan.devices), "engine": plan.memory.engine,
            "devices": [{"name": d.name, "holds": d.holds, "total_bytes": d.total_bytes, "margin_bytes": d.margin_bytes,
                         "verdict": d.verdict} for d in plan.memory.devices],
            "verdict": plan.memory.verdict,
            "margin_bytes": plan.memory.margin_bytes, "mode": plan.mode.resolved, "chain": list(plan.mode.chain),
            "k": plan.speculation.k, "s": plan.speculation.s, "rollback": plan.speculation.rollback}


def _report(findings: list[Finding], documents: dict, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"findings": [f.to_json() for f in findings], "documents": documents}, indent=2))
        return
    for finding in findings:
        click.echo(finding.render())
    plan = documents.get("plan")
    if plan:
        click.echo(f"plan {plan['digest'][:12]}: {plan['verdict']} on {plan['device']} (margin "
                   f"{format_size(abs(plan['margin_bytes']))}{' over' if plan['margin_bytes'] < 0 else ''}), "
                   f"{plan['mode']} K{plan['k']}/S{plan['s']}, rollback {plan['rollback']}")
    errors = sum(1 for f in findings if f.is_error)
    click.echo(
        f"{len(findings)} finding(s), {errors} error(s)"
        + ("; wrote manifest.toml and profile.toml" if documents else "")
    )
