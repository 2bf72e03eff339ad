"""The GGUF value types and the GGML tensor and file types, as small tables of our own.

The `gguf` package defines them too, but importing it costs a command that only
reads a header more than the rest of its start-up (yaml and a 4,000-line table of
constants come with it).
`tests/test_ggml_types.py` keeps every entry here equal to the `gguf` package's.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class ValueType(enum.IntEnum):
    """A GGUF metadata value's type (`gguf_type` in ggml's gguf.h)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


class QuantType(NamedTuple):
    """A GGML tensor type: its name and layout (`block_size` elements stored in `type_size` bytes)."""

    name: str
    block_size: int
    type_size: int


_QK_K = 256  # the elements of a K-quant super-block

# GGML type id -> the type (ggml.h `ggml_type`; ids 4, 5 and 31-33, 36-38 are retired).
QUANT_TYPES: dict[int, QuantType] = {
    0: QuantType("F32", 1, 4),
    1: QuantType("F16", 1, 2),
    2: QuantType("Q4_0", 32, 2 + 16),
    3: QuantType("Q4_1", 32, 2 + 2 + 16),
    6: QuantType("Q5_0", 32, 2 + 4 + 16),
    7: QuantType("Q5_1", 32, 2 + 2 + 4 + 16),
    8: QuantType("Q8_0", 32, 2 + 32),
    9: QuantType("Q8_1", 32, 4 + 4 + 32),
    10: QuantType("Q2_K", _QK_K, 2 + 2 + _QK_K // 16 + _QK_K // 4),
    11: QuantType("Q3_K", _QK_K, 2 + _QK_K // 4 + _QK_K // 8 + 12),
    12: QuantType("Q4_K", _QK_K, 2 + 2 + _QK_K // 2 + 12),
    13: QuantType("Q5_K", _QK_K, 2 + 2 + _QK_K // 2 + _QK_K // 8 + 12),
    14: QuantType("Q6_K", _QK_K, 2 + _QK_K // 2 + _QK_K // 4 + _QK_K // 16),
    15: QuantType("Q8_K", _QK_K, 4 + _QK_K + _QK_K // 8),
    16: QuantType("IQ2_XXS", _QK_K, 2 + _QK_K // 4),
    17: QuantType("IQ2_XS", _QK_K, 2 + _QK_K // 4 + _QK_K // 32),
    18: QuantType("IQ3_XXS", _QK_K, 2 + _QK_K // 4 + _QK_K // 8),
    19: QuantType("IQ1_S", _QK_K, 2 + _QK_K // 8 + _QK_K // 16),
    20: QuantType("IQ4_NL", 32, 2 + 16),
    21: QuantType("IQ3_S", _QK_K, 2 + _QK_K // 4 + _QK_K // 8 + _QK_K // 32 + 4),
    22: QuantType("IQ2_S", _QK_K, 2 + _QK_K // 4 + _QK_K // 16),
    23: QuantType("IQ4_XS", _QK_K, 2 + 2 + _QK_K // 2 + _QK_K // 64),
    24: QuantType("I8", 1, 1),
    25: QuantType("I16", 1, 2),
    26: QuantType("I32", 1, 4),
    27: QuantType("I64", 1, 8),
    28: QuantType("F64", 1, 8),
    29: QuantType("IQ1_M", _QK_K, _QK_K // 8 + _QK_K // 16 + _QK_K // 32),
    30: QuantType("BF16", 1, 2),
    34: QuantType("TQ1_0", _QK_K, 2 + 4 * 13),
    35: QuantType("TQ2_0", _QK_K, 2 + 64),
    39: QuantType("MXFP4", 32, 1 + 16),
    40: QuantType("NVFP4", 64, 4 + 32),
    41: QuantType("Q1_0", 128, 2 + 16),
}
QUANT_BY_NAME: dict[str, QuantType] = {quant.name: quant for quant in QUANT_TYPES.values()}

# `general.file_type` -> the name llama.cpp gives it (`llama_ftype` in llama.h, without its MOSTLY_ prefix).
FILE_TYPES: dict[int, str] = {
    0: "ALL_F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS",
    20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M",
    28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
    39: "NVFP4", 40: "Q1_0", 1024: "GUESSED",
}
