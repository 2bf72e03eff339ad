"""The memory model: what an engine allocates for a plan, per device and component, from GGUF headers.

- `model`: the vocabulary (Request, DeviceBudget, Split, Component with its
  basis, DeviceSizing, Sizing) and what every engine on a GPU shares (the CUDA
  context and graph pool estimates, a recurrent layer's state widths);
- `llama_graph`: the reserved compute graph as ggml builds it, exact for
  llama-server and the activation estimate of vLLM's sizer;
- `fit`: the largest context that fits, the layer split that fits, for any engine's sizer.

Each engine's own sizer lives in its folder (`power.orchestrator.engines.<engine>.sizing`; llama-server's context
parameters and layer split beside it), and its adapter says which it is.

docs/sizing.md gives every rule with its source.
"""

from power.orchestrator.engines.sizing.fit import Sizer, fitting_split, largest_context
from power.orchestrator.engines.sizing.model import (
    CheckpointDraft,
    Component,
    DeviceBudget,
    DeviceSizing,
    MiB,
    Request,
    Sizing,
    SlotFacts,
    Split,
    trunk_layers,
    whole,
)

__all__ = ["CheckpointDraft", "Component", "DeviceBudget", "DeviceSizing", "MiB", "Request", "Sizer", "Sizing",
           "SlotFacts",
           "Split", "fitting_split", "largest_context", "trunk_layers", "whole"]
