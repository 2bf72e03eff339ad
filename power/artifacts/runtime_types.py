"""The GGML tensor types Power's runtime reads, and the finding for a tensor of any other type (PWR122).

Read from the GGUF header's tensor table alone (no tensor data), so `power plan` and
`power verify` refuse, for a plan whose engine is Power's runtime, the file (the target or a
GGUF drafter) the runtime's loader (`power.runtime.gguf_weights.GGUFFile.expect`) would refuse at run. Importable
without torch; tests/test_header_values.py keeps `RUNTIME_TYPES` equal to the types
power/kernels/dequant.py dequantises and the CPU kernels multiply.
"""

from __future__ import annotations

from typing import Iterable

from power.artifacts.gguf_reader import TensorInfo
from power.findings import Finding, Severity

RUNTIME_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


def unreadable_type(path: str, name: str, type_name: str) -> Finding | None:
    """PWR122 for tensor `name` of `type_name`, which the runtime cannot dequantise; None for a type it reads."""
    if type_name in RUNTIME_TYPES:
        return None
    return Finding("PWR122", Severity.ERROR, f"tensor {name!r} is {type_name}, which the runtime cannot "
                   f"dequantise (supported: {', '.join(RUNTIME_TYPES)})", file=path, where=name,
                   hint="requantise the model to one of them, or plan it for engine \"llama-server\"")


def unreadable_types(path: str, tensors: Iterable[TensorInfo]) -> list[Finding]:
    """PWR122 for every tensor of the file the runtime cannot dequantise."""
    return [finding for tensor in tensors if (finding := unreadable_type(path, tensor.name, tensor.type_name))]
