"""`power inspect FILE`: what a GGUF artifact's header says, as a readable report or one JSON object.

Exit codes: 0 the header was read and its values are sound; 1 the file is not a
readable GGUF (the PWR10x finding goes to stderr, or into the JSON object's
`findings` with --json), or a header value no engine can run (PWR117/PWR12x: the
report is printed, the findings follow it on stderr and are in the JSON's `findings`).
"""

from __future__ import annotations

import json
import sys
from typing import Any, Sequence

import click

from power.app.cli import EXIT_FINDINGS
from power.artifacts.digests import sha256_file
from power.artifacts.facts import ArtifactError, ArtifactFacts, inspect_artifact
from power.artifacts.ggml_types import FILE_TYPES
from power.artifacts.gguf_reader import view_element_type
from power.findings import has_errors
from power.modes import DFLASH, DFLASH2, DSPARK, MTP

CONTRACT_NAMES = {DFLASH: "DFlash v1", DFLASH2: "DFlash2 (convolution + selector)",
                  DSPARK: "DSpark (Markov head, confidence-scheduled)", MTP: "MTP/nextn head inside the target"}
REFERENCE_CONTEXTS = (4096, 32768, 262144)
ARRAY_PREVIEW = 8


@click.command("inspect")
@click.argument("file", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the report.")
@click.option("--no-cache", is_flag=True, help="Hash the file even when the digest cache knows it.")
@click.option("--no-hash", is_flag=True, help="Skip the sha256 (header only).")
def inspect(file: str, as_json: bool, no_cache: bool, no_hash: bool) -> None:
    """Inspect a GGUF artifact: metadata, architecture, tensor census, tokenizer, drafter contract, sha256."""
    try:
        facts = inspect_artifact(file)
        digest = None if no_hash else sha256_file(file, use_cache=not no_cache)
    except ArtifactError as error:
        if as_json:
            click.echo(json.dumps({"file": file, "findings": [error.finding.to_json()]}, indent=2))
        else:
            click.echo(error.finding.render(), err=True)
        sys.exit(EXIT_FINDINGS)
    if as_json:
        click.echo(json.dumps({**facts.to_json(), "sha256": digest}, indent=2))
    else:
        click.echo(render_report(facts, digest))
        for finding in facts.findings:
            click.echo(finding.render(), err=True)
    if has_errors(list(facts.findings)):
        sys.exit(EXIT_FINDINGS)


def render_report(facts: ArtifactFacts, digest: str | None) -> str:
    sections = [_summary(facts, digest), _hparams(facts), _layers(facts), _census(facts), _tokenizer(facts),
                _drafter(facts)]
    return "\n\n".join(section for section in sections if section)


def _rows(rows: Sequence[tuple[str, ...]], indent: str = "  ") -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        indent + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def _bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _value(value: Any) -> str:
    if isinstance(value, memoryview):
        shown = ", ".join(_value(item) for item in value[:ARRAY_PREVIEW].tolist())
        return f"[{shown}, ...] ({len(value):,} {view_element_type(value)} items)"
    if isinstance(value, list):
        shown = ", ".join(_value(item) for item in value[:ARRAY_PREVIEW])
        return (
            f"[{shown}{', ...' if len(value) > ARRAY_PREVIEW else ''}] ({len(value)} items)"
            if len(value) > ARRAY_PREVIEW
            else f"[{shown}]"
        )
    if isinstance(value, float):
        return f"{value:.7g}"
    if isinstance(value, str) and len(value) > 80:
        return repr(value[:77] + "...")
    return repr(value) if isinstance(value, str) else str(value)


def _file_type(file_type: int | None) -> str:
    """`general.file_type` with llama.cpp's name for it: "15 (Q4_K_M)"."""
    if file_type is None:
        return "-"
    return f"{file_type} ({FILE_TYPES[file_type]})" if file_type in FILE_TYPES else f"{file_type} (unknown to Power)"


def _summary(facts: ArtifactFacts, digest: str | None) -> str:
    rows = [
        ("file", facts.path),
        ("architecture", facts.architecture),
        ("name", facts.name or "-"),
        ("file type", _file_type(facts.file_type)),
        ("size", f"{facts.size:,} B ({_bytes(facts.size)})"),
        ("header", f"GGUF v{facts.version}, {len(facts.metadata)} keys, {len(facts.tensors)} tensors, "
                   f"data at byte {facts.data_offset:,} (alignment {facts.alignment})"),
        ("sha256", digest or "(not hashed: --no-hash)"),
    ]
    general = [(key, _value(value)) for key, value in facts.metadata.items()
               if key.startswith("general.") and key not in ("general.architecture", "general.name",
                                                             "general.file_type")]
    text = "artifact\n" + _rows(rows)
    return text + ("\n\nmetadata\n" + _rows(general) if general else "")


def _hparams(facts: ArtifactFacts) -> str:
    prefix = f"{facts.architecture}."
    rows = [(key[len(prefix):], _value(value)) for key, value in facts.metadata.items() if key.startswith(prefix)]
    return f"hyper-parameters ({facts.architecture})\n" + _rows(rows) if rows else ""


def _layers(facts: ArtifactFacts) -> str:
    if not facts.layers:
        return ""
    counts: dict[str, int] = {}
    for layer in facts.layers:
        counts[layer.kind] = counts.get(layer.kind, 0) + 1
    header = [("layer", "kind", "kv heads", "head dim k/v", "tensors", "bytes")]
    rows = [(str(layer.index), layer.kind, str(layer.n_head_kv), f"{layer.head_dim_k}/{layer.head_dim_v}",
             str(layer.tensor_count), f"{layer.nbytes:,}") for layer in facts.layers]
    summary = ", ".join(f"{count} {kind}" for kind, count in counts.items())
    return f"layers: {summary}\n" + _rows(header + rows)


def _census(facts: ArtifactFacts) -> str:
    total = facts.tensor_bytes or 1
    header = [("type", "tensors", "elements", "bytes", "share")]
    rows = [(row.ggml_type, str(row.count), f"{row.elements:,}", f"{row.nbytes:,}", f"{100 * row.nbytes / total:.1f}%")
            for row in facts.census]
    footer = [("total", str(len(facts.tensors)), f"{sum(r.elements for r in facts.census):,}",
               f"{facts.tensor_bytes:,}", "")]
    return "tensor census\n" + _rows(header + rows + footer)


def _tokenizer(facts: ArtifactFacts) -> str:
    tok = facts.tokenizer
    if tok is None:
        return "tokenizer\n  (none: the header carries no tokenizer.ggml.tokens)"
    special = " ".join(f"{name}={value}" for name, value in tok.special_ids.items()) or "-"
    rows = [
        ("model", tok.model or "-"), ("pre", tok.pre or "-"), ("vocab", f"{tok.vocab_size:,}"),
        ("merges", f"{tok.merges_count:,}"), ("special ids", special),
        ("add bos/eos", f"{tok.add_bos}/{tok.add_eos}"),
        ("fingerprint", f"sha256 {tok.fingerprint} (complete vocabulary)"),
        ("first 2000", f"sha256(first 2000 tokens)={tok.short_fingerprint}"),
    ]
    return "tokenizer\n" + _rows(rows)


def _drafter(facts: ArtifactFacts) -> str:
    kind = facts.drafter_kind
    rows = [("contract", f"{kind} - {CONTRACT_NAMES[kind]}" if kind else "none (not a drafter, no MTP head)")]
    if kind:
        window = facts.sliding_window
        rows.append(("sliding window",
                     f"{window} positions" if window else "none: the draft KV spans the whole context"))
        per_position = facts.drafter_kv_bytes_per_position
        rows.append(("drafter KV", f"{per_position:,} B per position (f16)"))
        for ctx in REFERENCE_CONTEXTS:
            cells = min(ctx, window) if window else ctx
            rows.append((f"  at ctx {ctx}", _bytes(per_position * cells)))
    return "drafter contract\n" + _rows(rows)
