"""Writing GGUF files: the one module that imports the `gguf` package (llama.cpp's gguf-py), for the drafters
`power drafter distill` exports (`power.drafters.export`) and the test fixtures (`power.artifacts.factory`).

Reading is `gguf_reader.py`'s (bounded, without the `gguf` package); `ggml_types.py` keeps the block sizes the
reader needs (`tests/test_ggml_types.py` holds them equal to gguf-py's).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGUFValueType as V

from power.artifacts.atomic import atomic_path

Q = gguf.GGMLQuantizationType  # the type a tensor is stored as
FileType = gguf.LlamaFileType  # `general.file_type`: the file's main type
F32, F16 = Q.F32, Q.F16


def block_values(ggml_type: Q) -> int:
    """The values one block of `ggml_type` holds (1 for F32 and F16)."""
    return gguf.GGML_QUANT_SIZES[ggml_type][0]


def stored_values(values: np.ndarray, ggml_type: Q) -> np.ndarray:
    """`values` (float32) as a file of `ggml_type` gives them back: quantised and dequantised."""
    return gguf.quants.dequantize(gguf.quants.quantize(values, ggml_type), ggml_type)


@dataclass(frozen=True)
class Tensor:
    """A tensor to write: float weights and the GGML type they are stored as."""

    values: np.ndarray
    ggml_type: Q = F32


def _add_metadata(writer: gguf.GGUFWriter, metadata: dict[str, Any]) -> None:
    """Typed like llama.cpp's converters: ints as uint32, floats as float32, int arrays as int32/uint32."""
    for key, value in metadata.items():
        if key == "general.architecture":
            continue
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif value and all(isinstance(item, int) for item in value):
            writer.add_key_value(key, list(value), V.ARRAY, sub_type=V.INT32)
        elif value and all(isinstance(item, (str, bytes)) for item in value):
            # bytes are written as they are: a test can store a token that is not UTF-8
            writer.add_key_value(key, list(value), V.ARRAY, sub_type=V.STRING)
        else:
            writer.add_array(key, list(value))


def _encoded(tensor: Tensor) -> tuple[np.ndarray, Q | None]:
    values = tensor.values.astype(np.float32)
    if tensor.ggml_type == F32:
        return values, None
    if tensor.ggml_type == F16:
        return values.astype(np.float16), None
    return gguf.quants.quantize(values, tensor.ggml_type), tensor.ggml_type



def write_gguf(path: Path, architecture: str, metadata: dict[str, Any], tensors: dict[str, Tensor]) -> Path:
    """Write a complete GGUF (header + tensor data) atomically."""
    with atomic_path(Path(path)) as temp:
        writer = gguf.GGUFWriter(temp, architecture)
        _add_metadata(writer, metadata)
        for name, tensor in tensors.items():
            data, raw_type = _encoded(tensor)
            writer.add_tensor(name, data, raw_dtype=raw_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return Path(path)


def tensor_nbytes(shape: tuple[int, ...], ggml_type: Q) -> int:
    block_size, type_size = gguf.GGML_QUANT_SIZES[ggml_type]
    return int(np.prod(shape[:-1], dtype=np.int64)) * (shape[-1] // block_size) * type_size


def write_sparse_gguf(path: Path, architecture: str, metadata: dict[str, Any],
                      tensors: dict[str, tuple[tuple[int, ...], Q]], total_size: int | None = None) -> Path:
    """Write a real header over a hole: tensor data is never written, the file is extended by truncate.

    `total_size` pads the file past the last tensor to a known real artifact's size.
    """
    with atomic_path(Path(path)) as temp:
        writer = gguf.GGUFWriter(temp, architecture)
        _add_metadata(writer, metadata)
        data_size = 0
        for name, (shape, ggml_type) in tensors.items():
            nbytes = tensor_nbytes(shape, ggml_type)
            writer.add_tensor_info(name, shape, np.dtype(np.float32), nbytes, raw_dtype=ggml_type)
            data_size += gguf.GGUFWriter.ggml_pad(nbytes, writer.data_alignment)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        assert writer.fout is not None  # write_header_to_file opened it
        fout = writer.fout[0]
        data_start = gguf.GGUFWriter.ggml_pad(fout.tell(), writer.data_alignment)
        end = data_start + data_size
        if total_size is not None and total_size < end:
            raise ValueError(f"{path}: the tensors need {end} bytes, more than total_size = {total_size}")
        fout.truncate(total_size or end)
        writer.close()
    return Path(path)
