"""`power fixtures build DIR`: write the small test GGUF artifacts and list them (name, path, size, sha256, kind)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from power.app.outputs import require_outputs
from power.artifacts.digests import sha256_file
from power.artifacts.facts import ArtifactError, inspect_artifact
from power.modes import NATIVE_HEADS

# Header-only fixtures are sparse files of real artifact sizes: hashing reads every byte of the hole.
HASH_LIMIT_BYTES = 100_000_000


@click.group("fixtures")
def fixtures() -> None:
    """Build the small test GGUF artifacts (targets and drafters)."""


@fixtures.command("build")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--hash-sparse", is_flag=True, help="Also hash the header-only fixtures (reads gigabytes of holes).")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def build(directory: Path, hash_sparse: bool, as_json: bool) -> None:
    """Write every fixture into DIRECTORY (deterministic: the same files, the same digests)."""
    from power.artifacts.factory import build_fixtures  # gguf's writer and numpy: not for `--help`

    require_outputs(directories=(directory,), as_json=as_json)
    rows = [_describe(name, path, hash_sparse) for name, path in build_fixtures(directory).items()]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = [("name", "path", "size", "sha256", "kind")] + [
        (row["name"], row["path"], f"{row['size']:,}", row["sha256"] or "(header only: --hash-sparse)", row["kind"])
        for row in rows]
    widths = [max(len(row[i]) for row in table) for i in range(5)]
    for row in table:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _kind(drafter_kind: str | None, architecture: str) -> str:
    head = drafter_kind in NATIVE_HEADS
    if drafter_kind is None or head:
        return f"target ({architecture})" + (" + mtp head" if head else "")
    return drafter_kind


def _describe(name: str, path: Path, hash_sparse: bool) -> dict:
    size = path.stat().st_size
    try:
        facts = inspect_artifact(path)
        kind = _kind(facts.drafter_kind, facts.architecture)
    except ArtifactError as error:
        kind = f"invalid ({error.finding.code})"
    digest = sha256_file(path) if hash_sparse or size <= HASH_LIMIT_BYTES else None
    return {"name": name, "path": str(path), "size": size, "sha256": digest, "kind": kind}
