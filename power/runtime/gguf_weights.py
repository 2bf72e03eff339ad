"""GGUF weights for the runtime: header metadata and tensors from one verified copy of the file.

The file is read once into memory this object owns and hashed as it is read
(`power.artifacts.verify.read_verified`): against the plan's sha256 when the
artifact names one, refused (PWR115) when it differs. The header is parsed from
those same bytes by the bounded reader (`power.artifacts.gguf_reader`) and must
pass the header-value checks every plan passes (`power.artifacts.header_values`);
every tensor's bytes are views of them. So the bytes that run are the bytes that
were verified: a write to the file after the check, during the load or while the
model serves never reaches the engine (a map or a second open by path would let
it through).

Once the weights are built from it (repacked, copied or dequantised into memory
of their own), `release()` lets the copy go, with the header's long arrays
(the vocabulary, scores, merges): the engine then holds the weights once, not
the file beside them. Nothing is read again afterwards: a tensor asked for after
the release is an error, never a second read of the file.

Shapes: GGUF stores `ne` innermost-first; `tensor()` returns the torch shape
(outermost first), e.g. `token_embd.weight` with ne = (640, 262144) is [262144, 640].
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from power.artifacts import gguf_reader
from power.artifacts.ggml_types import QUANT_TYPES
from power.artifacts.gguf_reader import ArtifactError
from power.artifacts.header_values import require_valid_header
from power.artifacts.verify import TARGET, Artifact, read_verified
from power.kernels import dispatch
from power.kernels.dequant import BLOCK_LAYOUT


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: str
    shape: tuple[int, ...]  # torch order (outermost first)
    offset: int  # absolute byte offset in the file
    nbytes: int


class GGUFFile:
    """A GGUF file: `metadata` (key -> value), `tensors` (name -> TensorInfo), tensor data from the verified copy.

    `GGUFFile(path)` takes the file as it is (its digest in `sha256`); `GGUFFile.verified(artifact)` refuses a
    file that is not the planned one."""

    def __init__(self, path: str | Path, artifact: Artifact | None = None) -> None:
        self.path = Path(path)
        data, self.sha256 = read_verified(artifact or Artifact(TARGET, self.path, None))
        header = gguf_reader.parse_header(data, self.path)
        require_valid_header(header)
        self.metadata: dict[str, Any] = header.metadata
        self.tensors = {t.name: TensorInfo(t.name, _type_name(t.ggml_type), t.shape, header.data_offset + t.offset,
                                           t.nbytes) for t in header.tensors}
        self.size = len(data)
        self._bytes: np.ndarray | None = np.frombuffer(data, dtype=np.uint8)
        self._released: weakref.ref[np.ndarray] | None = None

    @classmethod
    def verified(cls, artifact: Artifact) -> GGUFFile:
        """The artifact, loaded only if its bytes are the ones the plan was sealed with (PWR110, PWR115 otherwise)."""
        return cls(artifact.path, artifact)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "<none>"))

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise ArtifactError(f"header key {key!r} is missing: the artifact does not describe a complete "
                                f"{self.architecture} model", code="PWR121", file=str(self.path),
                                hint="re-convert the model with a current llama.cpp convert script")
        return self.metadata[key]

    def raw(self, name: str) -> torch.Tensor:
        """The tensor's bytes as a flat uint8 torch tensor: a view of the verified copy (treat it as read-only; copy
        what must outlive `release()`)."""
        info = self.info(name)  # the header reader has checked every extent against the file size
        if self._bytes is None:
            raise RuntimeError(f"{self.path}: tensor {name!r} was asked for after the file's bytes were released "
                               "(GGUFFile.release, once the weights are built); read every tensor before releasing")
        return torch.from_numpy(self._bytes[info.offset:info.offset + info.nbytes])

    def release(self) -> None:
        """Let the verified copy of the file go, and the header's long arrays (vocabulary, scores, merges), once
        everything that reads them is built. Its memory is freed unless a view of it is still held (`held_bytes`)."""
        if self._bytes is not None:
            self._released = weakref.ref(self._bytes)
            self._bytes = None
        self.metadata = {key: value for key, value in self.metadata.items()
                         if not (isinstance(value, (list, memoryview)) and len(value) > gguf_reader.MAX_LIST_ELEMENTS)}

    @property
    def held_bytes(self) -> int:
        """The bytes of the verified copy still in memory: the file's size until `release()`, and after it too while
        anything holds a view of them (0 once they are freed)."""
        alive = self._bytes is not None or (self._released is not None and self._released() is not None)
        return self.size if alive else 0

    def info(self, name: str) -> TensorInfo:
        if name not in self.tensors:
            raise ArtifactError(f"tensor {name!r} is missing; a {self.architecture} model needs it", code="PWR121",
                                file=str(self.path), hint="re-convert the model completely")
        return self.tensors[name]

    def tensor(self, name: str, shape: Sequence[int] | None = None, device: str = "cpu") -> torch.Tensor:
        """Dequantise `name` to float32 in torch order on `device` (its packed bytes move there first, so a GPU
        dequantises with the Triton kernels), checking it has `shape` when given."""
        info = self.expect(name, shape)
        return dispatch.dequantize(info.qtype, self.raw(name).to(device), info.shape)

    def expect(self, name: str, shape: Sequence[int] | None = None) -> TensorInfo:
        """`name`'s facts, checked: it exists, has `shape` when given, and is of a type the runtime dequantises."""
        info = self.info(name)
        if shape is not None and tuple(info.shape) != tuple(shape):
            raise ArtifactError(f"tensor {name!r} has shape {list(info.shape)}, expected {list(shape)} from the "
                                "header's hyperparameters", code="PWR121", file=str(self.path),
                                hint="the artifact is inconsistent: re-convert it")
        if info.qtype not in BLOCK_LAYOUT:
            raise ArtifactError(f"tensor {name!r} is {info.qtype}, which the runtime cannot dequantise "
                                f"(supported: {', '.join(BLOCK_LAYOUT)})", code="PWR122", file=str(self.path),
                                hint="requantise the model to one of them")
        return info

    def has(self, name: str) -> bool:
        return name in self.tensors


def _type_name(ggml_type: int) -> str:
    return QUANT_TYPES[ggml_type].name if ggml_type in QUANT_TYPES else f"GGML type {ggml_type}"
