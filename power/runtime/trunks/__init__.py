"""Trunk models: one module per architecture, chosen by the GGUF header's `general.architecture`.

`load_trunk` is the one entry point; an architecture without a module here is a
clear `ArtifactError`, never a best-effort guess.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from power.artifacts.gguf_reader import ArtifactError
from power.documents.arithmetic import QUANTISED
from power.documents.kv_types import F32
from power.runtime.gguf_weights import GGUFFile
from power.runtime.greedy_head import CALIBRATION_TEXT
from power.runtime.tokenizer import Tokenizer
from power.runtime.trunks.base import FixedShapeTrunk, TrunkOptions

# general.architecture -> (module under power.runtime.trunks, class)
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "gemma3": ("gemma3", "Gemma3Trunk"),
    "llama": ("llama", "LlamaTrunk"),
    "qwen2": ("llama", "LlamaTrunk"),
    "qwen3": ("llama", "LlamaTrunk"),
    "qwen35": ("qwen35", "Qwen35Trunk"),
}


def load_trunk(path: str | Path | GGUFFile, *, n_ctx: int, verify_capacity: int, snapshot_rows: int = 0,
               arithmetic: str = QUANTISED, device: str = "cpu", prefill_chunk: int | None = None,
               slots: int = 1, kernel_path: str = "auto", kv_type: str = F32,
               greedy_head: bool = True, layer_kernels: bool = True) -> FixedShapeTrunk:
    """Build the trunk for the GGUF at `path` (or an opened `GGUFFile`) in `arithmetic`
    (`power.documents.arithmetic`), with forwards of at most `verify_capacity` rows, holding `slots` sequences of
    `n_ctx` positions each, on the CPU or GPU path (`kernel_path`, `TrunkOptions.path`), its attention caches holding
    their rows in `kv_type` (`power.documents.kv_types`), greedy rows' tokens from the exact greedy LM head where
    `power.documents.greedy_head` allows and `greedy_head` (its blocks calibrated on `CALIBRATION_TEXT`), each layer as
    one CPU kernel call where the architecture has one and `layer_kernels` (`TrunkOptions.layer_kernels`)."""
    gguf = path if isinstance(path, GGUFFile) else GGUFFile(path)
    architecture = gguf.architecture
    if architecture not in ARCHITECTURES:
        raise ArtifactError(f"architecture {architecture!r} is not implemented by the Power runtime "
                            f"(implemented: {', '.join(sorted(ARCHITECTURES))})", code="PWR120", file=str(gguf.path),
                            hint="use a plan whose target is one of these, or render the plan for llama-server instead")
    options = TrunkOptions(n_ctx=n_ctx, verify_capacity=verify_capacity, snapshot_rows=snapshot_rows,
                           arithmetic=arithmetic, device=device, slots=slots, path=kernel_path, kv_type=kv_type,
                           greedy_head=greedy_head, layer_kernels=layer_kernels,
                           **({"prefill_chunk": prefill_chunk} if prefill_chunk else {}))
    module_name, class_name = ARCHITECTURES[architecture]
    module = importlib.import_module(f"power.runtime.trunks.{module_name}")
    trunk: FixedShapeTrunk = getattr(module, class_name)(gguf, options)
    if trunk.head_refusal is None:
        trunk.take_greedy_head(Tokenizer.from_gguf(gguf).encode(CALIBRATION_TEXT))
    return trunk
