"""A drafter published as a Hugging Face checkpoint folder, as vLLM loads one: what its `config.json` says (the
kind, by the name in `architectures`; the draft block size; the target it was trained against: its layer count,
width, vocabulary and the layers whose hidden states it reads; its own layers and KV heads, for sizing) and, when
it carries one, the vocabulary of its `tokenizer.json`, for the identity check against the target GGUF's
(`power.orchestrator.planning.checks.checkpoints`).

The keys are the DFlash reference checkpoints' (github.com/z-lab/dflash: `block_size` and `target_layer_ids` under
`dflash_config`, `num_target_layers` beside them) and the EAGLE-3 ones vLLM reads
(vllm/model_executor/models/llama_eagle3.py: `target_hidden_size`, else `hidden_size`, is the width of each of
the three target hidden states its `fc` fuses; `draft_vocab_size`, else `vocab_size`, its head's rows;
`eagle_aux_hidden_state_layer_ids` the target layers it reads; a speculators-format checkpoint keeps the layer's
own keys under `transformer_layer_config`). Weights are vLLM's to load and are only hashed and sized here.
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
KIND_BY_ARCHITECTURE = (("DFlash2", modes.DFLASH2), ("DFlash", modes.DFLASH), ("DSpark", modes.DSPARK),
                        ("Eagle3", modes.EAGLE3))
WEIGHTS_SUFFIX = ".safetensors"


@dataclass(frozen=True)
class CheckpointFacts:
    folder: Path
    architecture: str
    kind: str | None  # None: an architecture no drafter kind names
    block_size: int | None
    target_layers: int | None  # num_target_layers: the depth of the target it reads hidden states from
    hidden_size: int | None
    vocab_size: int | None
    target_hidden_size: int | None  # the width of the target hidden states it reads (EAGLE-3; None: hidden_size)
    draft_vocab_size: int | None  # its own head's rows, mapped onto the target's vocabulary (EAGLE-3)
    aux_layer_ids: tuple[int, ...] | None  # the target layers whose hidden states it reads
    layers: int | None  # its own decoder layers, each with a KV cache
    kv_heads: int | None
    head_dim: int | None
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
    layer = _table(config, "transformer_layer_config") or config
    tokens, merges = _vocabulary(folder / TOKENIZER) if TOKENIZER in names else (None, None)
    heads, hidden = _int(layer.get("num_attention_heads")), _int(layer.get("hidden_size"))
    return CheckpointFacts(
        folder=folder, architecture=architecture,
        kind=next((kind for marker, kind in KIND_BY_ARCHITECTURE if marker.lower() in architecture.lower()), None),
        block_size=_int(draft.get("block_size", config.get("block_size"))),
        target_layers=_int(config.get("num_target_layers")), hidden_size=hidden,
        vocab_size=_int(layer.get("vocab_size")), target_hidden_size=_int(config.get("target_hidden_size")),
        draft_vocab_size=_int(config.get("draft_vocab_size")),
        aux_layer_ids=_aux_layer_ids(config, draft),
        layers=_int(layer.get("num_hidden_layers")), kv_heads=_int(layer.get("num_key_value_heads", heads)),
        head_dim=_int(layer.get("head_dim")) or (hidden // heads if hidden and heads else None),
        tokens=tokens, merges=merges)


def _aux_layer_ids(config: dict[str, Any], draft: dict[str, Any]) -> tuple[int, ...] | None:
    """The target layers whose hidden states the drafter reads: EAGLE-3's (at the top, as vLLM reads them, or under
    `eagle_config`), or DFlash's `target_layer_ids`."""
    key = "eagle_aux_hidden_state_layer_ids"
    return _ints(config.get(key, _table(config, "eagle_config").get(key, draft.get("target_layer_ids"))))


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
                  if isinstance(entry, dict) and isinstance(entry.get("id"),
                                                            int) and isinstance(entry.get("content"), str)}
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


def _ints(value: Any) -> tuple[int, ...] | None:
    """A list of whole numbers as a tuple; None when it is absent or holds anything else."""
    if not isinstance(value, list) or any(_int(item) is None for item in value):
        return None
    return tuple(value)
