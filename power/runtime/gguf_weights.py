"""GGUF weights for the runtime: header metadata, and each tensor's bytes copied into place as verified.

Opening a file reads its header and hashes the whole file once, in order
(`power.artifacts.verify.verified_regions`): against the plan's sha256 when the
artifact names one, refused (PWR115) when it differs. The same read keeps the
sha256 of the header's bytes and of each tensor's bytes, and nothing else: no
copy of the file is held. The header that was parsed must hash to what was
verified, and it must pass the header-value checks every plan passes
(`power.artifacts.header_values`). `raw(name)` then reads that tensor's bytes
into a buffer of its own and checks them against their digest before anyone
sees them, so the bytes that run are the bytes that were verified: a write to
the file after the check never reaches the engine (PWR116). A tensor whose
weights or block scales hold a NaN or Inf is refused there too (PWR126,
`power.runtime.finite_weights`): it would turn every logit it reaches into NaN.
Memory holds the weights as the engine builds them (repacked, copied or dequantised), one
tensor's bytes at a time beside them, never the whole file.

Before any of that, a file whose tensor data is all holes (a header-only replica
of a model, as the artifact factory builds for sizing) is refused as such
(PWR650): there are no weights to run.

`release()` closes the file and drops the header's long arrays (the vocabulary,
scores, merges) once everything is built: a tensor asked for afterwards is an
error, never a second read.

Shapes: GGUF stores `ne` innermost-first; `tensor()` returns the torch shape
(outermost first), e.g. `token_embd.weight` with ne = (640, 262144) is [262144, 640].
"""

from __future__ import annotations

import errno
import hashlib
import os
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from power.artifacts import gguf_reader
from power.artifacts.ggml_types import QUANT_TYPES
from power.artifacts.gguf_reader import ArtifactError, GGUFHeader
from power.artifacts.header_values import require_valid_header
from power.artifacts.runtime_types import unreadable_type
from power.artifacts.verify import TARGET, Artifact, present, verified_regions
from power.kernels import dispatch
from power.runtime.finite_weights import FLOAT_TYPES, first_non_finite


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: str
    shape: tuple[int, ...]  # torch order (outermost first)
    offset: int  # absolute byte offset in the file
    nbytes: int


class GGUFFile:
    """A GGUF file: `metadata` (key -> value), `tensors` (name -> TensorInfo), each tensor's verified bytes on demand.

    `GGUFFile(path)` takes the file as it is (its digest in `sha256`); `GGUFFile.verified(artifact)` refuses a
    file that is not the planned one."""

    def __init__(self, path: str | Path, artifact: Artifact | None = None) -> None:
        self.path = Path(path)
        artifact = artifact or Artifact(TARGET, self.path, None)
        present(artifact)
        fd, opened = gguf_reader.open_regular_file(self.path)
        self._fd: int | None = fd
        self._closer = weakref.finalize(self, os.close, fd)
        try:
            header = gguf_reader.read_open_header(fd, opened.st_size, str(self.path))
            require_valid_header(header)
            require_tensor_data(fd, header)
            self.sha256, self._digests = _verified_digests(artifact, fd, opened.st_size, header)
        except BaseException:
            self.release()
            raise
        self.metadata: dict[str, Any] = header.metadata
        self.tensors = {t.name: TensorInfo(t.name, _type_name(t.ggml_type), t.shape, header.data_offset + t.offset,
                                           t.nbytes) for t in header.tensors}
        self.size = opened.st_size

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
        """The tensor's bytes as a flat uint8 torch tensor of its own, read from the file and checked against the
        digest the verifying read took (PWR116 when they differ: the file changed after it was verified)."""
        info = self.info(name)  # the header reader has checked every extent against the file size
        if self._fd is None:
            raise RuntimeError(f"{self.path}: tensor {name!r} was asked for after the file was released "
                               "(GGUFFile.release, once the weights are built); read every tensor before releasing")
        buffer = torch.empty(info.nbytes, dtype=torch.uint8)
        view, done = buffer.numpy().data, 0
        while done < info.nbytes and (n := os.preadv(self._fd, [view[done:]], info.offset + done)):
            done += n
        if done != info.nbytes or hashlib.sha256(view).digest() != self._digests[name]:
            raise ArtifactError(f"tensor {name!r}'s bytes are not the ones verified when the file was opened: the "
                                "file changed while the model loaded", code="PWR116", file=str(self.path),
                                offset=info.offset,
                                hint="wait until whatever writes the file is done, then start again")
        if (at := first_non_finite(info.qtype, buffer)) is not None:
            raise ArtifactError(f"tensor {name!r} ({info.qtype}) holds a NaN or Inf {_value_kind(info.qtype)} at "
                                f"byte {at:,} of its data: every logit it reaches would be NaN", code="PWR126",
                                file=str(self.path), offset=info.offset + at,
                                hint="the file is corrupt: re-download or re-quantise it")
        return buffer

    def release(self) -> None:
        """Close the file, and drop the header's long arrays (vocabulary, scores, merges), once everything that reads
        them is built."""
        self._fd = None
        self._closer()
        self.metadata = {key: value for key, value in getattr(self, "metadata", {}).items()
                         if not (isinstance(value, (list, memoryview)) and len(value) > gguf_reader.MAX_LIST_ELEMENTS)}

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
        if unreadable := unreadable_type(str(self.path), name, info.qtype):
            raise ArtifactError.of(unreadable)
        return info

    def has(self, name: str) -> bool:
        return name in self.tensors


def _value_kind(qtype: str) -> str:
    return "weight" if qtype in FLOAT_TYPES else "block scale"


def _type_name(ggml_type: int) -> str:
    return QUANT_TYPES[ggml_type].name if ggml_type in QUANT_TYPES else f"GGML type {ggml_type}"


def require_tensor_data(fd: int, header: GGUFHeader) -> None:
    """A file whose tensor data holds no byte (all of it a hole) is a header-only replica: refused before hashing."""
    tensor_bytes = sum(t.nbytes for t in header.tensors)
    block = os.fstat(fd).st_blksize
    if tensor_bytes <= block or not _all_hole(fd, -(-header.data_offset // block) * block):
        return
    raise ArtifactError(f"the file holds no tensor data: its {tensor_bytes:,} bytes of tensors are one hole (a "
                        "header-only replica, as `power fixtures build` makes for sizing), so there are no weights to "
                        "run", code="PWR650", file=header.path, offset=header.data_offset,
                        hint="point the manifest at the real model file; header-only replicas can be planned, sized "
                             "and reviewed, not run")


def _all_hole(fd: int, start: int) -> bool:
    """No data from `start` (the block after the header's last) to the end of the file (a file system without
    SEEK_DATA reports data everywhere)."""
    try:
        os.lseek(fd, start, os.SEEK_DATA)
    except OSError as err:
        return err.errno == errno.ENXIO
    return False


def _verified_digests(artifact: Artifact, fd: int, size: int, header: GGUFHeader) -> tuple[str, dict[str, bytes]]:
    """The file's sha256 (checked against the plan) and each tensor's bytes' sha256, from one read; the header that
    was parsed must be the header that was hashed."""
    tensors = sorted(header.tensors, key=lambda t: t.offset)
    parsed = min(len(header.raw), header.data_offset)  # the header's bytes up to its padding
    regions = [(0, parsed)] + [(header.data_offset + t.offset, t.nbytes) for t in tensors]
    sha256, digests = verified_regions(artifact, fd, size, regions)
    if hashlib.sha256(memoryview(header.raw)[:parsed]).digest() != digests[0]:
        raise ArtifactError("the header changed between its reading and the file's verification", code="PWR116",
                            file=header.path, hint="wait until whatever writes the file is done, then start again")
    return sha256, {t.name: digest for t, digest in zip(tensors, digests[1:], strict=True)}
