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
  (lower first); None means it must be named explicitly.
- **llama.cpp / vLLM**: how the engines spell it today, and the spellings they
  retired.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Artifact = Literal["none", "target", "file"]

AUTO = "auto"
NONE = "none"
MTP, DFLASH, DFLASH2, DSPARK, NGRAM, DRAFT_MODEL = "mtp", "dflash", "dflash2", "dspark", "ngram", "draft-model"


@dataclass(frozen=True)
class LlamaSpelling:
    spec_type: str  # the current `--spec-type` value
    retired: tuple[str, ...] = ()  # earlier spellings: current llama.cpp does not know them and runs without speculation
    aliases: tuple[str, ...] = ()  # other current values Power reads as this mode


@dataclass(frozen=True)
class Mode:
    name: str  # Power's spelling: spec_mode, the drafter kind, the plan's chain
    artifact: Artifact
    context_backed: bool
    adaptive: bool = False
    fr: bool = False
    auto_priority: int | None = None
    reserved: bool = False  # no production adapter: a plan fails closed
    header_architecture: str | None = None  # the `general.architecture` a file-backed drafter carries
    llama: LlamaSpelling | None = None
    vllm_method: str | None = None
    vllm_aliases: tuple[str, ...] = ()  # other vLLM methods Power reads as this mode
    speculator: str | None = None  # the runtime module (under power.runtime.speculators) whose `build` makes it
    fixed_shape: str | None = None  # why the adaptive controller does not drive it (None when `adaptive`)

    @property
    def file_backed(self) -> bool:
        return self.artifact == "file"


MODES: tuple[Mode, ...] = (
    Mode(MTP, "target", context_backed=True, adaptive=True, fr=True, auto_priority=2,
         llama=LlamaSpelling("draft-mtp", retired=("mtp",)),
         vllm_method="mtp", vllm_aliases=("deepseek_mtp", "qwen3_next_mtp"), speculator="mtp"),
    Mode(DFLASH, "file", context_backed=True, adaptive=True, auto_priority=1, header_architecture="dflash",
         llama=LlamaSpelling("draft-dflash", retired=("dflash",)), vllm_method="dflash", speculator="dflash"),
    Mode(DFLASH2, "file", context_backed=True, auto_priority=1, header_architecture="dflash", speculator="dflash",
         fixed_shape="DFlash2 keeps a fixed draft shape"),
    Mode(DSPARK, "file", context_backed=True, adaptive=True, auto_priority=1, header_architecture="dspark",
         llama=LlamaSpelling("draft-dspark", retired=("dspark",)), vllm_method="dspark", speculator="dspark"),
    Mode(NGRAM, "none", context_backed=False, auto_priority=3,
         llama=LlamaSpelling("ngram-mod", aliases=("ngram-simple", "ngram-cache", "ngram-map-k", "ngram-map-k4v")),
         vllm_method="ngram", speculator="ngram",
         fixed_shape="n-gram proposals are not scheduled by the adaptive controller"),
    Mode(DRAFT_MODEL, "file", context_backed=True, reserved=True,
         llama=LlamaSpelling("draft-simple", retired=("draft",)), vllm_method="draft_model",
         fixed_shape="draft-model has no adapter"),
)

# Engine spellings of drafters Power has no adapter for: an import names them instead of calling them unknown.
FOREIGN_LLAMA_SPEC_TYPES = {"draft-eagle3": "eagle3"}
FOREIGN_LLAMA_RETIRED = {"eagle3": "draft-eagle3"}
FOREIGN_VLLM_METHODS = ("eagle", "eagle3", "medusa", "mlp_speculator")
# llama.cpp's `--spec-type none`: no speculation.
LLAMA_NO_SPECULATION = "none"

BY_NAME: dict[str, Mode] = {mode.name: mode for mode in MODES}
DRAFTER_KINDS: tuple[str, ...] = tuple(BY_NAME)
SPEC_MODES: tuple[str, ...] = (AUTO, NONE, *DRAFTER_KINDS)
FILE_BACKED: frozenset[str] = frozenset(m.name for m in MODES if m.file_backed)
CONTEXT_BACKED: frozenset[str] = frozenset(m.name for m in MODES if m.context_backed)
WEIGHT_FREE: frozenset[str] = frozenset(m.name for m in MODES if m.artifact == "none")
# Kinds whose contract lives in a GGUF header (the target's nextn heads, or the drafter's own file).
HEADER_CONTRACT: frozenset[str] = frozenset(m.name for m in MODES if m.artifact != "none" and not m.reserved)
# spec_mode values the adaptive controller may drive (auto: when it resolves to one of them).
ADAPTIVE_SPEC_MODES: frozenset[str] = frozenset({AUTO, *(m.name for m in MODES if m.adaptive)})
FR_SPEC_MODES: frozenset[str] = frozenset(m.name for m in MODES if m.fr)

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
