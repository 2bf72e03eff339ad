"""The memory model: what an engine allocates for a plan, per device and component, from GGUF headers.

- `model`: the vocabulary (Request, DeviceBudget, Split, Component with its
  basis, DeviceSizing, Sizing);
- `llama_context`, `llama_graph`, `placement`, `llama_server`: llama-server
  exactly (context parameters, the reserved compute graph, the layer split,
  the buffers);
- `power_runtime`: Power's own runtime (its KV layout, labelled estimates);
- `vllm`: vLLM under tensor parallelism (estimates);
- `fit`: the largest context that fits, the layer split that fits, for any engine's sizer.

Which module sizes which engine is the engine adapter's to say
(`power.orchestrator.engines`).

docs/sizing.md gives every rule with its source.
"""

from power.orchestrator.sizing.fit import Sizer, fitting_split, largest_context
from power.orchestrator.sizing.model import (
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
from power.orchestrator.sizing.vllm import tensor_parallel_issue

__all__ = [
    "CheckpointDraft","Component", "DeviceBudget", "DeviceSizing", "MiB", "Request", "Sizer", "Sizing", "SlotFacts", "Split",
           "fitting_split", "largest_context", "tensor_parallel_issue", "trunk_layers", "whole"]
