"""What each speculation mode is: one frozen record per mode, and every table derived from them.

This is the one place the modes are defined. The profile's `spec_mode`, the
manifest's drafter `kind`, the plan's chain, the renderers' engine flags, the
launch-line importer and the runtime's speculator registry all read these
records; none keeps a list of its own. Adding a speculator means adding its
record here, its speculator module, and its tests.

Torch-free and dependency-free, so the CLI imports it at no cost.

Vocabulary:
- **artifact**: where the drafter's weights live: `none` (weight-free n-gram),
  `target` (native heads inside the target GGUF), `file` (a separate GGUF that
  names its target's sha256).
- **context-backed**: the drafter keeps a draft context (device memory and
  mutable state). At most one runs in a plan; weight-free n-gram may chain in
  front of it.
- **adaptive**: the adaptive controller (`spec_mtp_adaptive`) schedules it.
- **fr**: it projects through a draft head whose vocabulary FR can cut.
- **auto**: whether `spec_mode = "auto"` may choose it, and with what priority
  (lower first); None means it must be named explicitly, and `opt_in` says why
  (docs/reference.md). `auto` chooses only what is known to win.
- **chain_loss**: for weight-free n-gram, docs/reference.md when it is
  chained in front of a context-backed drafter on a recurrent (hybrid) target:
  `auto` never builds that chain, and an explicit one is warned about.
- **draft_cost**: what one round of drafting costs in drafter steps, by kind
  (step 3): a plain model runs K sequential forwards, a trained head
  about one pass whatever K, n-gram lookup nothing (`power worth-it` prices it).
- **confidence_gate**: `spec_draft_p_min` cuts its drafts (DSpark's confidence head; an MTP head's top
  draft probability, as llama.cpp's draft-mtp stops at the first draft below it).
- **sidecar**: a native head that may also come as a separate file (an MTP-only
  GGUF for a target shipped without its head), bound by the target's sha256.
- **checkpoint_only**: its drafter is published as a Hugging Face checkpoint
  folder (what vLLM loads), never as a GGUF Power checks.
- **llama.cpp / vLLM**: how the engines spell it today, and the spellings they
  retired.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Artifact = Literal["none", "target", "file"]
# Drafter steps one round costs: K sequential forwards, about one pass whatever K, or none.
DraftCost = Literal["per-token", "per-round", "none"]
DRAFT_COST_TEXT = {"per-token": "K sequential forwards", "per-round": "about one pass per round",
                   "none": "no model pass"}

AUTO = "auto"
NONE = "none"
MTP, DFLASH, DFLASH2, DSPARK, EAGLE3, NGRAM, DRAFT_MODEL = (
    "mtp", "dflash", "dflash2", "dspark", "eagle3", "ngram", "draft-model")


@dataclass(frozen=True)
class LlamaSpelling:
    spec_type: str  # the current `--spec-type` value
    retired: tuple[
        str, ...
    ] = ()  # earlier spellings: current llama.cpp does not know them and runs without speculation
    aliases: tuple[str, ...] = ()  # other current values Power reads as this mode


@dataclass(frozen=True)
class Mode:
    name: str  # Power's spelling: spec_mode, the drafter kind, the plan's chain
    artifact: Artifact
    context_backed: bool
    adaptive: bool = False
    fr: bool = False
    draft_cost: DraftCost = "per-round"
    auto_priority: int | None = None
    opt_in: str | None = None  # why `auto` never chooses it (None when it may)
    chain_loss: str | None = None  # n-gram: the measured loss of chaining it on a recurrent target
    confidence_gate: bool = False
    sidecar: bool = False
    checkpoint_only: bool = False
    reserved: bool = False  # no production adapter: a plan fails closed
    header_architecture: str | None = None  # the `general.architecture` a file-backed drafter carries
    llama: LlamaSpelling | None = None
    llama_refusal: str | None = None  # why Power cannot render it for llama-server, where llama.cpp has it
    vllm_method: str | None = None
    vllm_aliases: tuple[str, ...] = ()  # other vLLM methods Power reads as this mode
    vllm_refusal: str | None = None  # why Power cannot render it for vLLM (None when it can)
    speculator: str | None = None  # the runtime module (under power.runtime.speculators) whose `build` makes it
    fixed_shape: str | None = None  # why the adaptive controller does not drive it (None when `adaptive`)

    @property
    def file_backed(self) -> bool:
        return self.artifact == "file"


# vLLM's MTP model types (vllm/config/speculative.py `MTPModelTypes`): each is native MTP.
VLLM_MTP_METHODS = (
    "deepseek_mtp", "dots3_note_mtp", "mimo_mtp", "mimo_v2_mtp", "glm4_moe_mtp", "glm4_moe_lite_mtp", "glm_ocr_mtp",
    "ernie_mtp", "nemotron_h_mtp", "exaone_moe_mtp", "exaone4_5_mtp", "qwen3_next_mtp", "qwen4_exp_mtp",
    "qwen3_5_mtp", "longcat_flash_mtp", "bailing_hybrid_v3_mtp", "minimax_m3_mtp", "bailing_hybrid_mtp",
    "kimi_k3_mtp", "pangu_ultra_moe_mtp", "step3p5_mtp", "hy_v3_mtp", "hy_v4_mtp", "gemma4_mtp", "inkling_mtp",
    "glm5_next_mtp",
)
# vLLM loads these drafters from Hugging Face checkpoints (safetensors + config.json); Power's are GGUF files.
_VLLM_HF_DRAFTER = ("vLLM loads {name} drafters as Hugging Face checkpoints (e.g. z-lab/Qwen3.6-35B-A3B-DFlash), "
                    "not GGUF, and DFlash's non-causal attention needs its flash_attn backend; Power's drafter is a "
                    "GGUF file")

MODES: tuple[Mode, ...] = (
    Mode(MTP, "target", context_backed=True, adaptive=True, fr=True, auto_priority=2, sidecar=True,
         confidence_gate=True,
         llama=LlamaSpelling("draft-mtp", retired=("mtp",)),
         vllm_method="mtp", vllm_aliases=VLLM_MTP_METHODS, speculator="mtp"),
    # Block drafters draft through the target's LM head, which the Power runtime cuts to the FR prefix as well.
    Mode(DFLASH, "file", context_backed=True, adaptive=True, fr=True, auto_priority=1, header_architecture="dflash",
         llama=LlamaSpelling("draft-dflash", retired=("dflash",)), vllm_method="dflash", speculator="dflash",
         vllm_refusal=_VLLM_HF_DRAFTER.format(name="DFlash")),
    Mode(DFLASH2, "file", context_backed=True, fr=True, header_architecture="dflash", speculator="dflash",
         opt_in="the reference measurements (docs/reference.md) keep DFlash2 opt-in: its 12-task quality calibration "
                "kept only 7/12 complete outputs",
         fixed_shape="DFlash2 keeps a fixed draft shape"),
    Mode(DSPARK, "file", context_backed=True, adaptive=True, fr=True, header_architecture="dspark",
         confidence_gate=True,
         opt_in="the reference measurements (docs/reference.md) found DSpark as no lossless production default: at "
                "context 1024 only 54/100 outputs matched the control and every request entered fallback replay",
         llama=LlamaSpelling("draft-dspark", retired=("dspark",)), vllm_method="dspark", speculator="dspark",
         vllm_refusal=_VLLM_HF_DRAFTER.format(name="DSpark")),
    # EAGLE-3 (arXiv:2503.01840): one decoder layer over three of the target's hidden states, drafting token by
    # token; vLLM loads it as a checkpoint (vllm/model_executor/models/llama_eagle3.py).
    Mode(EAGLE3, "file", context_backed=True, draft_cost="per-token", checkpoint_only=True,
         opt_in="EAGLE-3 runs on vLLM only, from a Hugging Face checkpoint: a plan names it",
         llama_refusal="llama.cpp's draft-eagle3 loads a GGUF converted from the checkpoint, whose header Power has "
                       "no contract for; Power checks EAGLE-3 drafters as the Hugging Face checkpoints vLLM loads",
         vllm_method="eagle3",
         fixed_shape="vLLM drafts EAGLE-3's num_speculative_tokens every round; Power's runtime does not run it"),
    Mode(NGRAM, "none", context_backed=False, draft_cost="none", auto_priority=3,
         chain_loss="the reference measurements (docs/reference.md) found draft-mtp,ngram-mod losing on all traffic on "
                    "the qwen35 hybrid: with n-gram in the chain llama.cpp disables recurrent rollback, which the "
                    "drafter's verification depends on",
         llama=LlamaSpelling("ngram-mod", aliases=("ngram-simple", "ngram-cache", "ngram-map-k", "ngram-map-k4v")),
         vllm_method="ngram", vllm_aliases=("ngram_gpu",), speculator="ngram",
         fixed_shape="n-gram proposals are not scheduled by the adaptive controller"),
    Mode(DRAFT_MODEL, "file", context_backed=True, draft_cost="per-token", reserved=True,
         llama=LlamaSpelling("draft-simple", retired=("draft",)), vllm_method="draft_model",
         fixed_shape="draft-model has no adapter"),
)

# Engine spellings of drafters Power has no adapter for: an import names them instead of calling them unknown.
FOREIGN_LLAMA_SPEC_TYPES = {"draft-eagle3": "eagle3"}
FOREIGN_LLAMA_RETIRED = {"eagle3": "draft-eagle3"}
FOREIGN_VLLM_METHODS = ("eagle", "medusa", "mlp_speculator", "suffix", "custom_class",
                        "extract_hidden_states")
# llama.cpp's `--spec-type none`: no speculation.
LLAMA_NO_SPECULATION = "none"

BY_NAME: dict[str, Mode] = {mode.name: mode for mode in MODES}
DRAFTER_KINDS: tuple[str, ...] = tuple(BY_NAME)
SPEC_MODES: tuple[str, ...] = (AUTO, NONE, *DRAFTER_KINDS)
FILE_BACKED: frozenset[str] = frozenset(m.name for m in MODES if m.file_backed)
CONTEXT_BACKED: frozenset[str] = frozenset(m.name for m in MODES if m.context_backed)
WEIGHT_FREE: frozenset[str] = frozenset(m.name for m in MODES if m.artifact == "none")
# Kinds whose contract lives in a GGUF header (the target's nextn heads, or the drafter's own file).
HEADER_CONTRACT: frozenset[str] = frozenset(m.name for m in MODES if m.artifact != "none" and not m.reserved
                                            and not m.checkpoint_only)
CHECKPOINT_ONLY: frozenset[str] = frozenset(m.name for m in MODES if m.checkpoint_only)
# Kinds whose weights are a target model's nextn blocks: in the target itself, or in a sidecar file of its model.
NATIVE_HEADS: frozenset[str] = frozenset(m.name for m in MODES if m.artifact == "target")
# The `general.architecture` a drafter file of each kind carries (its contract: power.artifacts.contracts).
ARCHITECTURE_OF: dict[str, str] = {m.name: m.header_architecture for m in MODES if m.header_architecture}
# spec_mode values the adaptive controller may drive (auto: when it resolves to one of them).
ADAPTIVE_SPEC_MODES: frozenset[str] = frozenset({AUTO, *(m.name for m in MODES if m.adaptive)})
FR_SPEC_MODES: frozenset[str] = frozenset(m.name for m in MODES if m.fr)
CONFIDENCE_GATED: frozenset[str] = frozenset(m.name for m in MODES if m.confidence_gate)

# llama.cpp `--spec-type` value -> Power's mode, current spellings and aliases.
BY_LLAMA_SPEC_TYPE: dict[str, str] = {
    spelling: m.name for m in MODES if m.llama for spelling in (m.llama.spec_type, *m.llama.aliases)
}
# A retired llama.cpp spelling -> the current one.
LLAMA_RETIRED: dict[str, str] = {
    old: m.llama.spec_type for m in MODES if m.llama for old in m.llama.retired
} | FOREIGN_LLAMA_RETIRED
# vLLM `method` -> Power's mode, current methods and aliases.
BY_VLLM_METHOD: dict[str, str] = {
    method: m.name for m in MODES if m.vllm_method for method in (m.vllm_method, *m.vllm_aliases)
}
# Every llama.cpp spelling a user might write for a mode (current, alias or retired) -> Power's mode name.
LLAMA_SPELLINGS: dict[str, str] = BY_LLAMA_SPEC_TYPE | {
    old: m.name for m in MODES if m.llama for old in m.llama.retired if old not in BY_NAME
}


def mode(name: str) -> Mode:
    """The record for a drafter kind; KeyError for `auto`, `none` or an unknown name."""
    return BY_NAME[name]


def auto_tiers() -> tuple[frozenset[str], ...]:
    """The modes `auto` may choose, grouped by priority, the best group first."""
    priorities = sorted({m.auto_priority for m in MODES if m.auto_priority is not None})
    return tuple(frozenset(m.name for m in MODES if m.auto_priority == priority) for priority in priorities)


def llama_spec_type(name: str) -> str | None:
    """llama.cpp's current `--spec-type` for a mode, or None when llama.cpp has none."""
    record = BY_NAME[name]
    return record.llama.spec_type if record.llama else None


def vllm_method(name: str) -> str | None:
    return BY_NAME[name].vllm_method


def quoted(names) -> str:
    """`"a", "b" or "c"`: mode names as a hint lists them."""
    names = [f'"{name}"' for name in names]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
