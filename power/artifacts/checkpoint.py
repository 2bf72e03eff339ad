"""A drafter published as a Hugging Face checkpoint folder, as vLLM loads one: what its `config.json` says (the
kind, by the name in `architectures`; the draft block size; the target it was trained against: its layer count,
width and vocabulary) and, when it carries one, the vocabulary of its `tokenizer.json`, for the identity check
against the target GGUF's (`power.orchestrator.checks.checkpoints`).

The keys are the DFlash reference checkpoints' (github.com/z-lab/dflash: `block_size` and `target_layer_ids` under
`dflash_config`, `num_target_layers` beside them); weights are vLLM's to load and are only hashed here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from power import modes
from power.artifacts.gguf_reader import ArtifactError

CONFIG = "config.json"
TOKENIZER = "tokenizer.json"
MAX_JSON_BYTES = 64 << 20  # a tokenizer.json of a 256k vocabulary is about 20 MB
# The kind a checkpoint is, by the name its config.json's `architectures` gives its model class (most specific first).
KIND_BY_ARCHITECTURE = (("DFlash2", modes.DFLASH2), ("DFlash", modes.DFLASH), ("DSpark", modes.DSPARK))


@dataclass(frozen=True)
class CheckpointFacts:
    folder: Path
    architecture: str
    kind: str | None  # None: an architecture no drafter kind names
    block_size: int | None
    target_layers: int | None  # num_target_layers: the depth of the target it reads hidden states from
    hidden_size: int | None
    vocab_size: int | None
    tokens: tuple[str, ...] | None  # tokenizer.json's vocabulary by id (None: the checkpoint carries none)
    merges: tuple[str, ...] | None


def listing_sha256(files: list[tuple[str, str]]) -> str:
    """One digest for a folder of (name, sha256) files: sha256 over `sha256sum`'s lines for them, sorted by name."""
    lines = "".join(f"{digest}  {name}\n" for name, digest in sorted(files))
    return hashlib.sha256(lines.encode()).hexdigest()


def read_checkpoint(folder: Path, names: list[str]) -> CheckpointFacts:
    """The facts of the checkpoint at `folder`; ArtifactError (PWR211) when its config.json is not one."""
    config = _json(folder / CONFIG)
    architectures = config.get("architectures")
    architecture = architectures[0] if isinstance(architectures, list) and architectures else None
    if not isinstance(architecture, str):
        raise ArtifactError(f"{CONFIG} names no model class in `architectures`", code="PWR211",
                            file=str(folder / CONFIG), hint="point `path` at the drafter checkpoint's own folder")
    draft = _table(config, "dflash_config")
    tokens, merges = _vocabulary(folder / TOKENIZER) if TOKENIZER in names else (None, None)
    return CheckpointFacts(
        folder=folder, architecture=architecture,
        kind=next((kind for marker, kind in KIND_BY_ARCHITECTURE if marker.lower() in architecture.lower()), None),
        block_size=_int(draft.get("block_size", config.get("block_size"))),
        target_layers=_int(config.get("num_target_layers")), hidden_size=_int(config.get("hidden_size")),
        vocab_size=_int(config.get("vocab_size")), tokens=tokens, merges=merges)


def _vocabulary(path: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """tokenizer.json's tokens by id (its model's vocabulary with the added tokens) and its BPE merges."""
    document = _json(path)
    model = _table(document, "model")
    by_id: dict[int, str] = {}
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        by_id |= {index: token for token, index in vocab.items() if isinstance(index, int)}
    elif isinstance(vocab, list):  # a Unigram model: [[piece, score], ...]
        by_id |= {index: entry[0] for index, entry in enumerate(vocab) if isinstance(entry, list) and entry}
    added = document.get("added_tokens")
    if isinstance(added, list):
        by_id |= {entry["id"]: entry["content"] for entry in added
                  if isinstance(entry, dict) and isinstance(entry.get("id"), int) and isinstance(entry.get("content"), str)}
    if not by_id or sorted(by_id) != list(range(len(by_id))):
        raise ArtifactError(f"{TOKENIZER} does not give one token for every id from 0", code="PWR211", file=str(path),
                            hint="use the tokenizer.json published with the checkpoint")
    merges = model.get("merges")
    merges = merges if isinstance(merges, list) else []
    return tuple(by_id[i] for i in range(len(by_id))), tuple(m if isinstance(m, str) else " ".join(m) for m in merges)


def _json(path: Path) -> dict[str, Any]:
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise ArtifactError(f"{path.name} is larger than {MAX_JSON_BYTES >> 20} MiB", code="PWR211", file=str(path),
                                hint="point `path` at the drafter checkpoint's own folder")
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ArtifactError(f"{path.name} does not exist in the checkpoint", code="PWR110", file=str(path),
                            hint="pull the checkpoint (`power pull MANIFEST`) or fix `path`") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ArtifactError(f"{path.name} is not readable JSON: {err}", code="PWR211", file=str(path),
                            hint="use the file published with the checkpoint") from None
    if not isinstance(document, dict):
        raise ArtifactError(f"{path.name} is not a JSON object", code="PWR211", file=str(path),
                            hint="use the file published with the checkpoint")
    return document


def _table(document: dict[str, Any], key: str) -> dict[str, Any]:
    value = document.get(key)
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
