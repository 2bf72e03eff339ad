"""The sizing vocabulary: what is asked (Request, the devices, the split) and what is answered (components per device).

Every number sizing produces is a `Component`: bytes, the header facts behind
them (`detail`), and how far the number can be trusted (`basis`):

- `exact`: the engine's own allocation rule, reproduced from its source and
  checked against the engine (tests/test_llama_conformance.py runs llama-server);
- `estimated`: a documented model of something not checked here (a CUDA
  context, a GPU's compute buffer, an engine whose allocator is not replayed);
- `measured`: a figure taken from a run of the engine on the device itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from power.artifacts.facts import NEXTN, ArtifactFacts, LayerFacts
from power.artifacts.ggml_types import QUANT_BY_NAME
from power.documents.arithmetic import QUANTISED

MiB = 1024**2
Basis = Literal["exact", "estimated", "measured"]
Verdict = Literal["fits", "fits-below-headroom", "does-not-fit"]
DeviceKind = Literal["gpu", "cpu"]
# A margin below this after the headroom needs a quiet device (docs/reference.md: 23,847 MiB peak on 24 GiB).
THIN_MARGIN_BYTES = 1024 * MiB
_VERDICT_ORDER = ("fits", "fits-below-headroom", "does-not-fit")
# CUDA context + cuBLAS workspace + loaded kernel images, per device (docs/sizing.md): an estimate, the same for
# every engine on a GPU.
CUDA_CONTEXT_BYTES = 384 * MiB
# CUDA graph pool per captured shape: an estimate.
CUDA_GRAPH_BYTES_PER_SHAPE = 64 * MiB


@dataclass(frozen=True)
class Component:
    name: str
    bytes: int
    detail: str
    basis: Basis = "exact"


@dataclass(frozen=True)
class DeviceBudget:
    """One device a deployment runs on: its index in the host's device list, what it offers, what stays free."""

    index: int
    name: str
    memory_bytes: int
    headroom_bytes: int
    kind: DeviceKind = "gpu"


@dataclass(frozen=True)
class Split:
    """How a model is spread over several devices.

    llama.cpp: `mode` "layer" gives each device a contiguous run of layers in
    proportion to `ratios` (`-sm layer -ts`), "none" runs everything on the
    `main` device (`-sm none -mg`). vLLM: `tensor_parallel` devices each hold
    1/TP of every layer (`--tensor-parallel-size`). `ratios` None: in proportion
    to each device's memory after its headroom (what Power renders as `-ts`).
    """

    mode: Literal["layer", "none"] = "layer"
    ratios: tuple[float, ...] | None = None
    main: int = 0  # position in the deployment's device list
    tensor_parallel: int = 1


def default_ratios(devices: tuple[DeviceBudget, ...]) -> tuple[float, ...]:
    """A split's ratios when the profile sets none, whatever the engine: each device's memory after its headroom
    (what Power renders as llama-server's `-ts`; llama.cpp's own default, free memory at load time, is not known
    when planning)."""
    return tuple(float(max(d.memory_bytes - d.headroom_bytes, 0)) for d in devices)


@dataclass(frozen=True)
class CheckpointDraft:
    """A drafter vLLM loads from a Hugging Face checkpoint: its weights' bytes (its safetensors files) and the
    shape of its own KV cache (its config.json)."""

    weights_bytes: int
    layers: int
    kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class Request:
    """The settings sizing depends on, from the profile, the resolved mode and the engine."""

    ctx: int
    slots: int = 1
    kv_unified: bool = False
    batch: int = 2048
    ubatch: int = 512
    verify_rows: int = 1  # Power's fixed verification shape
    arithmetic: str = QUANTISED  # Power's matrix products (power.documents.arithmetic): what its weights hold
    snapshots: int = 0  # Power: S resident recurrent snapshots
    chain: tuple[str, ...] = ()  # the resolved mode's chain (power.modes names), first proposer first
    draft_max: int = 0  # K, the proposal width
    ngram_draft_max: int = 0  # n-gram's longest draft
    kv_cache_type: str = "f16"
    draft_kv_cache_type: str = "f16"
    flash_attn: bool = False
    cuda_graphs: bool = True
    gpu_layers: int | None = None  # None: every layer on the devices
    draft_gpu_layers: int | None = None  # the drafter's (llama-server --spec-draft-ngl); None: every layer
    draft_device: int | None = None  # the drafter's device (a position in the devices); None: split as the target
    # drafter tensors placed by name (--spec-draft-override-tensor): (regex, position in the devices, or None: host)
    draft_overrides: tuple[tuple[str, int | None], ...] = ()
    use_mtp: bool = False
    fr_vocab_size: int | None = None
    vocab: int = 0  # the target's vocabulary: logits rows, and the LM head drafters borrow
    checkpoint_draft: CheckpointDraft | None = None  # vLLM: the drafter it loads from a checkpoint folder
    split: Split = field(default_factory=Split)


@dataclass(frozen=True)
class DeviceSizing:
    device: DeviceBudget
    components: tuple[Component, ...]
    holds: str = ""  # which layers (and the output layer) sit here, for people

    @property
    def total_bytes(self) -> int:
        return sum(c.bytes for c in self.components)

    @property
    def margin_bytes(self) -> int:
        """What is left after the headroom; negative when the plan eats into it or overflows."""
        return self.device.memory_bytes - self.device.headroom_bytes - self.total_bytes

    @property
    def verdict(self) -> Verdict:
        if self.margin_bytes >= 0:
            return "fits"
        if self.total_bytes <= self.device.memory_bytes:
            return "fits-below-headroom"
        return "does-not-fit"

    @property
    def thin(self) -> bool:
        return self.verdict == "fits" and self.margin_bytes < THIN_MARGIN_BYTES


@dataclass(frozen=True)
class SlotFacts:
    """What each parallel sequence gets, as the engine derives it from the settings."""

    slots: int
    kv_unified: bool
    engine_ctx: int  # the engine's whole context after its padding and rounding
    ctx_per_slot: int  # KV cells one sequence may fill
    kv_streams: int  # separate KV caches (one per slot unless unified)
    sliding_cells: int | None  # cells of each stream of a sliding-window cache
    batch: int  # after the engine's clamping
    ubatch: int
    outputs: int  # logits rows the engine reserves for one decode call


@dataclass(frozen=True)
class Sizing:
    engine: str
    ctx: int
    slots: SlotFacts
    devices: tuple[DeviceSizing, ...]
    host: tuple[Component, ...] = ()  # host memory (input layer, output buffer, ...): not part of any device's verdict
    max_ctx: int | None = None
    fitting_split: tuple[int, ...] | None = None  # layers per device that fit at ctx when the plan's split does not

    @property
    def components(self) -> tuple[Component, ...]:
        return tuple(c for device in self.devices for c in device.components)

    @property
    def total_bytes(self) -> int:
        return sum(device.total_bytes for device in self.devices)

    @property
    def margin_bytes(self) -> int:
        """The smallest device margin."""
        return min(device.margin_bytes for device in self.devices)

    @property
    def verdict(self) -> Verdict:
        """The worst device's verdict."""
        return max((device.verdict for device in self.devices), key=_VERDICT_ORDER.index)

    @property
    def thin(self) -> bool:
        return self.verdict == "fits" and any(device.thin for device in self.devices)


# --- bytes from header fields -------------------------------------------------


def type_bytes(n_elements: int, type_name: str) -> int:
    """Bytes of n elements of a GGML type (block-quantised types count whole blocks: ggml_row_size)."""
    quant = QUANT_BY_NAME[type_name.upper()]
    return -(-n_elements // quant.block_size) * quant.type_size


def is_quantized(type_name: str) -> bool:
    return QUANT_BY_NAME[type_name.upper()].block_size > 1


def pad(value: int, to: int) -> int:
    return -(-value // to) * to


def whole(value: Any, default: int = 0) -> int:
    """An integer hparam, or `default` when the header lacks it or carries another type (its checks report that)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def largest(value: Any, default: int) -> int:
    """The largest layer's value of a scalar or per-layer array hparam (a compute buffer is sized for it)."""
    if isinstance(value, (list, tuple)):
        return max((whole(v) for v in value), default=default)
    return whole(value, default)


def trunk_layers(facts: ArtifactFacts) -> list[LayerFacts]:
    return [layer for layer in facts.layers if layer.kind != NEXTN]


def block_index(tensor_name: str) -> int | None:
    """The layer a `blk.N.*` tensor belongs to; None for the input and output layers' tensors."""
    if tensor_name.startswith("blk."):
        return int(tensor_name.split(".")[1])
    return None


def recurrent_row_widths(facts: ArtifactFacts) -> tuple[int, int]:
    """llama_hparams::n_embd_r (conv state) and n_embd_s (ssm / delta state) of a Mamba-style /
    gated delta-net layer."""
    d_conv = whole(facts.hparam("ssm.conv_kernel"))
    d_inner = whole(facts.hparam("ssm.inner_size"))
    d_state = whole(facts.hparam("ssm.state_size"))
    n_group = whole(facts.hparam("ssm.group_count"))
    return max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state), d_state * d_inner
