"""PWR11x: what the manifest declares about an artifact against the file itself.

A missing file names its path and the manifest line that declared it; a file
that is not a readable GGUF is the reader's own PWR10x finding (artifact path and
byte offset) that also names the manifest line pointing at it (`declared_at`); a header
value no engine can run is a PWR117/PWR12x finding at the key's byte offset
(`power.artifacts.header_values`); size, sha256, quant and architecture mismatches point
at the manifest key to correct.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from power.artifacts.bounded_reader import lookup_problem
from power.artifacts.facts import ArtifactError, ArtifactFacts
from power.artifacts.ggml_types import FILE_TYPES
from power.artifacts.header_values import NO_TENSORS, NO_TENSORS_HINT
from power.findings import Finding
from power.orchestrator.inputs.loading import Loaded


@dataclass(frozen=True)
class Checked:
    """An artifact that passed its checks: its facts and its sha256 (None when digests were not asked for)."""

    facts: ArtifactFacts
    sha256: str | None


class ArtifactSource(Protocol):
    """Where checks get headers and digests (the compiler's memo reads each file once)."""

    def facts(self, path: Path) -> ArtifactFacts: ...

    def sha256(self, path: Path) -> str: ...


def check_artifact(manifest: Loaded, where: str, declared, source: ArtifactSource,
                   with_digest: bool = True) -> tuple[Checked | None, list[Finding]]:
    """Inspect the file `declared.path` names and compare it with what `manifest` declares at `where`."""
    path = Path(declared.path)
    problem = lookup_problem(path)
    if problem is not None:
        return None, [manifest.finding(
            "PWR110", f"{where}.path: {path} {problem}", where=f"{where}.path",
            hint="fix the path (it is relative to the manifest), or fetch the artifact there")]
    try:
        facts = source.facts(path)
        digest = source.sha256(path) if with_digest else None
    except ArtifactError as err:
        return None, [_named_by(manifest, f"{where}.path", err.finding)]
    findings = [
        *facts.findings,
        *_tensors(manifest, where, facts),
        *_size(manifest, where, declared.size, facts),
        *_digest(manifest, where, declared.sha256, digest),
        *_quant(manifest, where, declared.quant, facts),
        *_architecture(manifest, where, getattr(declared, "architecture", None), facts),
    ]
    return (None if findings else Checked(facts, digest)), findings


def _tensors(manifest: Loaded, where: str, facts: ArtifactFacts) -> list[Finding]:
    if facts.tensors:
        return []
    return [manifest.finding("PWR124", f"{where}.path: {NO_TENSORS}", where=f"{where}.path", hint=NO_TENSORS_HINT)]


def _named_by(manifest: Loaded, where: str, finding: Finding) -> Finding:
    """The artifact's own finding (file, byte offset), with the manifest line that points at the artifact."""
    line, col, _ = manifest.locate(where) or (None, None, None)
    place = ":".join(str(part) for part in (manifest.path, line, col) if part is not None)
    return dataclasses.replace(finding, where=where, declared_at=place)


def file_quant(facts: ArtifactFacts) -> str:
    """The quant the header declares (`general.file_type`, as llama.cpp names it), else the dominant tensor type."""
    if facts.file_type in FILE_TYPES:
        return FILE_TYPES[facts.file_type]
    return facts.census[0].ggml_type if facts.census else "unknown"


def _size(manifest: Loaded, where: str, declared: int | None, facts: ArtifactFacts) -> list[Finding]:
    if declared is None or declared == facts.size:
        return []
    delta = facts.size - declared
    return [manifest.finding(
        "PWR111", f"{where}.size = {declared:,} but {facts.path} is {facts.size:,} bytes "
        f"({abs(delta):,} bytes {'larger' if delta > 0 else 'smaller'})", where=f"{where}.size",
        hint="a partial download or another build of the artifact: fetch it again, or declare the file you mean")]


def _digest(manifest: Loaded, where: str, declared: str | None, actual: str | None) -> list[Finding]:
    if declared is None or actual is None or declared == actual:
        return []
    return [manifest.finding(
        "PWR112", f"{where}.sha256 does not match the file: it hashes to {actual}", where=f"{where}.sha256",
        hint="the file is another artifact than the one declared: fetch the declared one, or, after checking "
        "where it came from, declare the file's digest")]


def _quant(manifest: Loaded, where: str, declared: str | None, facts: ArtifactFacts) -> list[Finding]:
    found = file_quant(facts)
    if declared is None or declared.upper() == found.upper():
        return []
    return [manifest.finding(
        "PWR113", f'{where}.quant = "{declared}" but the header of {facts.path} declares {found}',
        where=f"{where}.quant", hint=f'declare quant = "{found}", or point the path at the {declared} artifact')]


def _architecture(manifest: Loaded, where: str, declared: str | None, facts: ArtifactFacts) -> list[Finding]:
    if declared is None or declared == facts.architecture:
        return []
    return [manifest.finding(
        "PWR114", f'{where}.architecture = "{declared}" but the header of {facts.path} says '
        f'general.architecture = "{facts.architecture}"', where=f"{where}.architecture",
        hint=f'declare architecture = "{facts.architecture}", or point the path at the {declared} artifact')]
