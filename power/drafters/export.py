"""Writing a distilled drafter out: its GGUF, a manifest naming it beside its target, and the profile to run it.

The GGUF follows the kind's contract (`power.artifacts.contracts`: the keys, the
tensors and their shapes, written by `power.artifacts.gguf_writer`, as the fixtures are) and carries
the target's tokenizer, so `power plan` and `power verify` check it like any
other drafter. The manifest binds it to the target by digest (`target_sha256`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from power.artifacts.atomic import atomic_path
from power.artifacts.contracts import (
    DrafterHparams,
    draft_tokens_key,
    drafter_metadata,
    mtp_sidecar_metadata,
)
from power.artifacts.digests import sha256_file
from power.artifacts.gguf_writer import F16, F32, FileType, Q, Tensor, stored_values, write_gguf
from power.modes import ARCHITECTURE_OF
from power.runtime.gguf_weights import GGUFFile

DEFAULT_CTX = 4096  # the bundled profiles' context
# The n-gram lookup the manifest chains in front of the drafter: the bundled n-gram profile's window
# (profiles/ngram.toml: the last 4 tokens, drafts of 2 or more), which bench/bench_drafter.py measures the chain with.
CHAINED_NGRAM_MATCH, CHAINED_NGRAM_DRAFT_MIN = 4, 2


@dataclass(frozen=True)
class Recommendation:
    """The profile the distillation recommends: K and S, and the confidence gate for a kind that has one."""

    k: int
    s: int
    ctx: int = DEFAULT_CTX
    p_min: float | None = None


Q8_0 = Q.Q8_0
BLOCK_MATRICES = F16  # block drafters run float32 products of their weights
MTP_MATRICES = Q8_0  # the MTP head multiplies its matrices in their GGUF blocks (power.runtime.speculators.mtp)


def write_drafter(path: Path, kind: str, hp: DrafterHparams, tensors: dict[str, torch.Tensor], target: Path,
                  name: str, draft_tokens: list[int] | None = None) -> Path:
    """The drafter GGUF: matrices in float16, vectors in float32, the target's tokenizer keys copied, and its draft
    vocabulary when it has one."""
    arch = ARCHITECTURE_OF[kind]
    metadata = {**drafter_metadata(kind, hp), **_tokenizer(GGUFFile(target)), **_draft_vocabulary(arch, draft_tokens)}
    return _write(path, arch, name, metadata, tensors, BLOCK_MATRICES)


def write_mtp_sidecar(path: Path, tensors: dict[str, torch.Tensor], target: Path, name: str,
                      draft_tokens: list[int] | None = None) -> Path:
    """The target's MTP-only GGUF: its header with one nextn block more (`contracts.mtp_sidecar_metadata`), the
    block's tensors (matrices in Q8_0, which the runtime head multiplies in place), the target's tokenizer keys, and
    the head's draft vocabulary when it has one."""
    source = GGUFFile(target)
    arch = source.architecture
    vocab = source.info("token_embd.weight").shape[0]
    metadata = {**mtp_sidecar_metadata(arch, source.metadata, vocab), **_tokenizer(source),
                **_draft_vocabulary(arch, draft_tokens)}
    return _write(path, arch, name, metadata, tensors, MTP_MATRICES)


def stored(tensors: dict[str, torch.Tensor], matrices: Q) -> dict[str, torch.Tensor]:
    """The tensors as the file will hold them (matrices rounded to `matrices`, vectors float32), as float32: what the
    runtime reads back, so the acceptance reported is the written drafter's."""
    def round_trip(value: torch.Tensor) -> torch.Tensor:
        qtype = _storage(value, matrices)
        if qtype == F32:
            return value.float().clone()
        return torch.from_numpy(stored_values(value.float().numpy(), qtype).copy()).reshape(value.shape).float()

    return {name: round_trip(value) for name, value in tensors.items()}


def _draft_vocabulary(arch: str, draft_tokens: list[int] | None) -> dict[str, Any]:
    return {} if draft_tokens is None else {draft_tokens_key(arch): list(draft_tokens)}


def _tokenizer(source: GGUFFile) -> dict[str, Any]:
    return {key: value for key, value in source.metadata.items() if key.startswith("tokenizer.")}


def _write(path: Path, architecture: str, name: str, metadata: dict[str, Any], tensors: dict[str, torch.Tensor],
           matrices: Q) -> Path:
    """Matrices of whole 32-value blocks in `matrices`, the rest in float32."""
    file_type = FileType.MOSTLY_Q8_0 if matrices == Q8_0 else FileType.MOSTLY_F16
    header = {"general.name": name, "general.file_type": int(file_type), **metadata}
    written = {key: Tensor(value.float().numpy(), _storage(value, matrices)) for key, value in tensors.items()}
    return write_gguf(path, architecture, header, written)


def _storage(value: torch.Tensor, matrices: Q) -> Q:
    return matrices if value.dim() == 2 and value.shape[1] % 32 == 0 else F32


def write_manifest(path: Path, name: str, target: Path, target_architecture: str, kind: str, drafter: Path,
                   target_sha256: str | None = None) -> Path:
    """manifest.toml beside the drafter: the target (by a path relative to the manifest; `target_sha256` as it was
    verified, else hashed now) and the new drafter."""
    target_sha = target_sha256 or sha256_file(target)
    drafter_sha = sha256_file(drafter)
    relative = Path(os.path.relpath(os.path.abspath(target), os.path.abspath(path.parent))).as_posix()
    text = "\n".join([
        'schema = "power.manifest/v1"',
        f'name = "{name}"',
        f'description = "A {kind} drafter distilled by power drafter distill from the target\'s own greedy text."',
        "",
        "[target]",
        f'path = "{relative}"',
        f"size = {Path(target).stat().st_size}",
        f'sha256 = "{target_sha}"',
        f'architecture = "{target_architecture}"',
        "",
        "[[drafters]]",
        f'kind = "{kind}"',
        f'path = "{drafter.name}"',
        f"size = {drafter.stat().st_size}",
        f'sha256 = "{drafter_sha}"',
        f'target_sha256 = "{target_sha}"',
        "",
        "[[drafters]]",
        'kind = "ngram"',
        "",
    ])
    return _write_text(path, text)


def write_profile(path: Path, name: str, kind: str, advice: Recommendation) -> Path:
    """profile.toml: the kind at the recommended K/S (and confidence gate), at a fixed verification shape of K + 1
    rows (no FR: the drafter's own draft vocabulary already bounds its head), with the window of the n-gram lookup
    the manifest chains in front of it."""
    lines = [
        'schema = "power.profile/v1"',
        f'name = "{name}"',
        f'description = "The distilled {kind} drafter at K{advice.k}/S{advice.s} '
        '(from the measured acceptance curve)."',
        f'spec_mode = "{kind}"',
        f"spec_draft_max = {advice.k}",
        f"spec_mtp_recurrent_snapshots = {advice.s}",
        *([f"spec_draft_p_min = {advice.p_min}"] if advice.p_min is not None else []),
        "spec_mtp_adaptive = false",
        "",
        "[runtime]",
        f"ctx = {advice.ctx}",
        f"verify_capacity = {advice.k + 1}",
        'kv_cache_type = "f16"',
        f"ngram_match = {CHAINED_NGRAM_MATCH}",
        f"ngram_draft_min = {min(CHAINED_NGRAM_DRAFT_MIN, advice.k)}",  # at most K, or the lookup never proposes
        "",
        "[sampling]",
        "temperature = 0.0",
        "seed = 0",
        'verify = "match"',
        "",
    ]
    return _write_text(path, "\n".join(lines))


def _write_text(path: Path, text: str) -> Path:
    with atomic_path(path) as temp:
        temp.write_text(text, encoding="utf-8")
    return path


def report(path: Path, content: dict[str, Any]) -> Path:
    """distill.json: what was trained, on what, for how long, and the acceptance curve it reached."""
    return _write_text(path, json.dumps(content, indent=2) + "\n")
