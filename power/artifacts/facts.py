"""ArtifactFacts: everything Power knows about a GGUF artifact from its header, frozen and serialisable.

`inspect_artifact(path) -> ArtifactFacts` reads the header (never tensor data) and
derives: every metadata key (the vocabulary arrays summarised by the tokenizer facts),
a tensor census by quant type and per layer, per-layer attention kinds, the drafter
contract, the sliding window and the drafter KV bytes per position.

Per-layer attention kind, from the header:
- `nextn`: one of the last `{arch}.nextn_predict_layers` blocks (an MTP head);
- `recurrent`: the block carries `ssm_*` tensors (gated delta net, Mamba);
- `sliding`: the architecture declares `{arch}.attention.sliding_window` and the layer is
  not global by `{arch}.attention.sliding_window_pattern` (a per-layer bool array, true =
  sliding, or an int n: every n-th layer global). Without a pattern key, the
  architectures that llama.cpp hard-codes use its pattern (`SWA_PATTERNS`), DFlash
  drafters slide on every layer, and any other declared window applies to every layer;
- `global` otherwise.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Mapping

from power.artifacts import contracts
from power.artifacts.gguf_reader import (
    ArtifactError,
    GGUFHeader,
    TensorInfo,
    artifact_error,
    read_header,
    view_element_type,
)
from power.artifacts.header_values import header_findings, require_plausible_layers
from power.artifacts.tokenizer_facts import VOCABULARY_KEYS, TokenizerFacts, tokenizer_facts
from power.findings import Finding

__all__ = ["GLOBAL", "NEXTN", "RECURRENT", "SLIDING", "ArtifactError", "ArtifactFacts", "LayerFacts", "QuantCensus",
           "facts_from_header", "inspect_artifact"]

# llama.cpp's hard-coded sliding-window patterns for headers that carry no pattern key:
# n means every n-th layer (index % n == n - 1) is global, the others slide.
SWA_PATTERNS = {"gemma2": 2, "gemma3": 6, "gemma3n": 5, "cohere2": 4}
GLOBAL, SLIDING, RECURRENT, NEXTN = "global", "sliding", "recurrent", "nextn"
_LAYER = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class QuantCensus:
    ggml_type: str
    count: int
    elements: int
    nbytes: int


@dataclass(frozen=True)
class LayerFacts:
    index: int
    kind: str  # global | sliding | recurrent | nextn
    n_head_kv: int  # 0 for recurrent layers
    head_dim_k: int
    head_dim_v: int
    tensor_count: int
    nbytes: int


@dataclass(frozen=True)
class ArtifactFacts:
    path: str
    size: int
    version: int
    alignment: int
    data_offset: int
    architecture: str
    name: str | None
    file_type: int | None
    metadata: dict[str, Any]
    value_types: dict[str, str]
    tensors: tuple[TensorInfo, ...]
    census: tuple[QuantCensus, ...]
    tensor_bytes: int
    layers: tuple[LayerFacts, ...]
    tokenizer: TokenizerFacts | None
    drafter_kind: str | None
    sliding_window: int | None
    drafter_kv_bytes_per_position: int
    # Header values no engine can run (`power.artifacts.header_values`): errors refuse a plan.
    findings: tuple[Finding, ...] = ()

    @property
    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        return {tensor.name: tensor.shape for tensor in self.tensors}

    def hparam(self, key: str, default: Any = None) -> Any:
        """`{architecture}.{key}` from the metadata."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path, "size": self.size, "version": self.version, "alignment": self.alignment,
            "data_offset": self.data_offset, "architecture": self.architecture, "name": self.name,
            "file_type": self.file_type, "metadata": {key: _json_value(value) for key, value in self.metadata.items()},
            "value_types": self.value_types,
            "tensors": [{"name": t.name, "type": t.type_name, "shape": list(t.shape), "offset": t.offset,
                         "nbytes": t.nbytes}
                        for t in self.tensors],
            "census": [vars(row) for row in self.census],
            "tensor_bytes": self.tensor_bytes,
            "layers": [vars(layer) for layer in self.layers],
            "tokenizer": self.tokenizer.to_json() if self.tokenizer else None,
            "drafter_kind": self.drafter_kind,
            "sliding_window": self.sliding_window,
            "drafter_kv_bytes_per_position": self.drafter_kv_bytes_per_position,
            "findings": [finding.to_json() for finding in self.findings],
        }


def _json_value(value: Any) -> Any:
    """A metadata value as JSON: a long numeric array (a view of the header) as its element type, count and sha256."""
    if isinstance(value, memoryview):
        return {"elements": view_element_type(value), "count": len(value), "sha256": hashlib.sha256(value).hexdigest()}
    if isinstance(value, list):
        return [_json_value(item) for item in value]
    return value


class _HeaderView:
    """The contracts' view of a header, before the facts exist."""

    def __init__(self, path: str, architecture: str, metadata: Mapping[str, Any],
                 tensors: tuple[TensorInfo, ...]) -> None:
        self.path, self.architecture, self.metadata = path, architecture, metadata
        self.tensor_shapes = {tensor.name: tensor.shape for tensor in tensors}


def inspect_artifact(path: str | os.PathLike[str]) -> ArtifactFacts:
    """Read a GGUF header into ArtifactFacts; raises ArtifactError (`.finding`, a PWR10x) on a bad file."""
    return facts_from_header(read_header(path))


def facts_from_header(header: GGUFHeader) -> ArtifactFacts:
    meta = {key: value for key, value in header.metadata.items() if key not in VOCABULARY_KEYS}
    architecture = meta.get("general.architecture")
    if not isinstance(architecture, str) or not architecture:
        raise artifact_error("PWR117", header.path, "general.architecture is missing or not a string",
                             "re-convert the artifact: every GGUF names its architecture", 0)
    require_plausible_layers(header)
    view = _HeaderView(header.path, architecture, meta, header.tensors)
    file_type = meta.get("general.file_type")
    return ArtifactFacts(
        path=header.path, size=header.size, version=header.version, alignment=header.alignment,
        data_offset=header.data_offset, architecture=architecture,
        name=meta.get("general.name") if isinstance(meta.get("general.name"), str) else None,
        file_type=file_type if isinstance(file_type, int) else None,
        metadata=meta,
        value_types={key: label for key, label in header.value_types.items() if key not in VOCABULARY_KEYS},
        tensors=header.tensors,
        census=_census(header.tensors),
        tensor_bytes=sum(tensor.nbytes for tensor in header.tensors),
        layers=_layers(view, header.tensors),
        tokenizer=tokenizer_facts(header),
        drafter_kind=contracts.classify_drafter(view),
        sliding_window=contracts.drafter_sliding_window(view),
        drafter_kv_bytes_per_position=contracts.drafter_kv_bytes_per_position(view),
        findings=tuple(header_findings(header)),
    )


def _census(tensors: tuple[TensorInfo, ...]) -> tuple[QuantCensus, ...]:
    rows: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for tensor in tensors:
        row = rows[tensor.type_name]
        row[0] += 1
        row[1] += _elements(tensor)
        row[2] += tensor.nbytes
    return tuple(QuantCensus(name, *values) for name, values in sorted(rows.items(), key=lambda item: -item[1][2]))


def _elements(tensor: TensorInfo) -> int:
    count = 1
    for dim in tensor.dims:
        count *= dim
    return count


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _per_layer(value: Any, layer: int) -> int:
    if isinstance(value, list):
        return _int(value[layer]) if layer < len(value) else 0
    return _int(value)


def _layers(view: _HeaderView, tensors: tuple[TensorInfo, ...]) -> tuple[LayerFacts, ...]:
    arch, meta = view.architecture, view.metadata
    by_layer: dict[int, list[TensorInfo]] = defaultdict(list)
    for tensor in tensors:
        match = _LAYER.match(tensor.name)
        if match is not None:  # every index is below MAX_BLOCK_COUNT: require_plausible_layers ran first
            by_layer[int(match.group(1))].append(tensor)
    block_count = max(_int(meta.get(f"{arch}.block_count")), max(by_layer, default=-1) + 1)
    n_nextn = contracts.nextn_layer_count(view)
    head_count = meta.get(f"{arch}.attention.head_count")
    width = _int(meta.get(f"{arch}.embedding_length"))
    layers = []
    for index in range(block_count):
        own = by_layer.get(index, [])
        kind = _layer_kind(view, index, block_count, n_nextn, own)
        heads = _per_layer(head_count, index)
        head_dim_k = _int(meta.get(f"{arch}.attention.key_length")) or (width // heads if heads else 0)
        head_dim_v = _int(meta.get(f"{arch}.attention.value_length")) or head_dim_k
        n_head_kv = 0 if kind == RECURRENT else _per_layer(meta.get(f"{arch}.attention.head_count_kv", head_count),
                                                           index)
        layers.append(LayerFacts(index, kind, n_head_kv, head_dim_k, head_dim_v, len(own), sum(t.nbytes for t in own)))
    return tuple(layers)


def _layer_kind(view: _HeaderView, index: int, block_count: int, n_nextn: int, own: list[TensorInfo]) -> str:
    arch, meta = view.architecture, view.metadata
    if n_nextn and index >= block_count - n_nextn:
        return NEXTN
    if any(".ssm_" in tensor.name for tensor in own):
        return RECURRENT
    if _int(meta.get(f"{arch}.attention.sliding_window")) <= 0:
        return GLOBAL
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):
        return SLIDING if index < len(pattern) and pattern[index] else GLOBAL
    every = _int(pattern) or SWA_PATTERNS.get(arch, 0)
    if every:
        return GLOBAL if index % every == every - 1 else SLIDING
    return SLIDING
