"""The KV cache element types Power's runtime holds, and what one cache row of each costs. Torch-free.

A cache row is one position of one KV head: `width` values (the head's key or value width). The runtime rounds
each row to the plan's `kv_cache_type` when it writes it, by itself (`power.runtime.kv_rows`), and attention reads
the rounded values back exactly in float32, so a row's bits never depend on the forward that wrote it: greedy
speculation stays token for token equal to plain decoding with every type. The sizing of Power's runtime charges
`row_bytes` (`power.orchestrator.engines.power.sizing`), the same rule the runtime allocates by.

- f32: 4 B a value; f16 and bf16: 2 B a value (IEEE half, bfloat16; round to nearest even);
- q8_0: llama.cpp's `block_q8_0` (ggml/src/ggml-common.h): blocks of 32 values, each an f16 scale d = max|x| / 127
  and 32 int8 round(x / d), 34 B a block; the row's width must be a whole number of blocks.
"""

from __future__ import annotations

from typing import Final, Literal

F32: Final = "f32"
F16: Final = "f16"
BF16: Final = "bf16"
Q8_0: Final = "q8_0"
RUNTIME_KV_TYPES = (F32, F16, BF16, Q8_0)
DEFAULT: Literal["f16"] = (
    F16  # a profile's kv_cache_type unless it names one (and a plan-less run's: it gives a default plan's tokens)
)
VALUE_BYTES = {F32: 4, F16: 2, BF16: 2}
Q8_0_BLOCK = 32
Q8_0_BLOCK_BYTES = 2 + Q8_0_BLOCK


def whole_blocks(kv_type: str, width: int) -> bool:
    """Whether a row of `width` values is a whole number of the type's blocks (any width for the float types)."""
    return kv_type != Q8_0 or width % Q8_0_BLOCK == 0


def row_bytes(kv_type: str, width: int) -> int:
    """The bytes one cache row of `width` values holds in `kv_type`."""
    if kv_type == Q8_0:
        return width // Q8_0_BLOCK * Q8_0_BLOCK_BYTES
    return width * VALUE_BYTES[kv_type]
