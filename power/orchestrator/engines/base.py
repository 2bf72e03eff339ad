"""What every engine adapter answers: its settings, what it can run, what it allocates, its command line.

An adapter is the one place an engine's knowledge lives (docs/architecture.md,
"Where an engine's knowledge lives"). The compiler asks `supports` before it
seals a plan, `fleet review` compiles through the same path, `render` asks again
for a plan read from disk, and sizing, rendering and importing call the adapter
rather than testing the engine's name. The mode vocabulary stays in
`power.modes`; an adapter reads the records' engine spellings.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Literal

from power.artifacts.facts import ArtifactFacts
from power.documents.plan import EngineName, ResolvedPlan, flash_attention_on
from power.findings import Finding
from power.orchestrator.engines.sizing.fit import fitting_split, largest_context
from power.orchestrator.engines.sizing.model import DeviceBudget, Request, Sizing
from power.orchestrator.inputs.launch_lines.spec import LaunchSpec, ValueReader
from power.orchestrator.inputs.launch_lines.tokens import EnvNames, Token

# Which file a refusal is located in: the profile (settings, the mode asked for) or the manifest (the drafters).
Document = Literal["profile", "manifest"]
# An engine's launch-line reader: the located words (program dropped) -> what they ask for, and the findings.
LaunchReader = Callable[[list[Token]], tuple[LaunchSpec, list[Finding]]]


@dataclass(frozen=True)
class LiveBench:
    """How `power bench` runs the engine live from its render and measures it: pure data the app reads."""

    binary_env: str  # the variable that names its executable when it is not on PATH
    native: bool  # llama-server's own /completion and /props, else OpenAI-shaped /v1/completions and /version
    counters: tuple[str, ...]  # the /metrics counters a request is measured by (deltas around it)
    thread_flags: tuple[str, ...]  # the options that take the machine's thread count
    install_hint: str  # how to get the executable


@dataclass(frozen=True)
class Refusal:
    """Something the engine cannot run, with the key a user changes (in the profile or the manifest)."""

    code: str
    message: str
    hint: str
    document: Document
    where: str


@dataclass(frozen=True)
class AskedDrafter:
    kind: str
    index: int | None  # its position in the manifest's drafters (None when read back from a plan)
    has_file: bool
    checkpoint: bool = False  # a Hugging Face checkpoint folder (what vLLM loads), not a GGUF


@dataclass(frozen=True)
class Asked:
    """What a deployment asks an engine to run, as the compiler knows it and as a plan records it."""

    chain: tuple[str, ...]
    drafters: tuple[AskedDrafter, ...]
    kv_cache_type: str
    flash_attn: bool
    tensor_parallel: int
    devices: int
    kv_unified: bool = False
    p_min: float | None = None  # the confidence gate asked of a gated drafter (spec_draft_p_min)
    # the drafter placed apart from the target: on its own device of several, or with layers left in host memory
    draft_placed: bool = False
    draft_kv_cache_type: str | None = None  # None: the target's
    graphs_on_gpu: bool = False  # runtime.cuda_graphs on a deployment whose devices include a GPU


    @classmethod
    def of_plan(cls, plan: ResolvedPlan) -> Asked:
        rt = plan.runtime
        return cls(plan.mode.chain, tuple(AskedDrafter(d.kind, None, d.path is not None, d.files is not None)
                                          for d in plan.drafters),
                   rt.kv_cache_type, flash_attention_on(rt.flash_attn), rt.tensor_parallel, len(plan.devices),
                   rt.kv_unified,
                   plan.speculation.p_min, draft_placed(rt.draft_device is not None, rt.draft_gpu_layers,
                                                        len(plan.devices)) or bool(rt.draft_override_tensor),
                   rt.draft_kv_cache_type, rt.cuda_graphs and any(d.kind == "gpu" for d in plan.devices))

    def checkpoint_refusals(self, engine: str) -> list[Refusal]:
        """PWR463 for each drafter given as a Hugging Face checkpoint, on an engine that loads GGUF drafters only."""
        return [Refusal("PWR463", f"{engine} loads GGUF drafters; this {d.kind} drafter is a Hugging Face checkpoint "
                        "folder (what vLLM loads)", 'run this deployment with engine "vllm", or use the drafter\'s '
                        "GGUF", *self.drafter_where(d.kind)) for d in self.drafters if d.checkpoint]

    def drafter_where(self, kind: str) -> tuple[Document, str]:
        """Where to point at a drafter of `kind`: its manifest entry, else the profile's spec_mode."""
        index = next((d.index for d in self.drafters if d.kind == kind and d.index is not None), None)
        return ("manifest", f"drafters[{index}].kind") if index is not None else ("profile", "spec_mode")


def draft_placed(own_device: bool, draft_gpu_layers: int | str, devices: int) -> bool:
    """Whether the drafter is placed apart from the target: its own device among several, or layers left on the host."""
    return (own_device and devices > 1) or draft_gpu_layers != "all"


@dataclass(frozen=True)
class Setting:
    """One plan setting as the engine spells it, as llama.cpp's `common/arg.cpp` keeps a `common_arg`: its flag on the
    command line, its variable, what it means, and how an imported launch line's value reads back into it."""

    field: str  # Power's name (the plan's runtime/sampling/speculation key, or the importer's LaunchSpec attribute)
    flag: str | None  # the word the render writes (None: the engine reads it only from its environment)
    env: str | None = None
    help: str = ""
    read: ValueReader | None = None  # how `power import` reads its value (None: not read from a launch line)
    off: str | None = None  # a switch's spelling that turns it off (`--no-kv-unified`)


@dataclass(frozen=True)
class Settings:
    """An engine's settings table, read in both directions."""

    entries: tuple[Setting, ...]

    def flag(self, field: str) -> str:
        flag = self._by_field()[field].flag
        if flag is None:
            raise KeyError(f"{field} has no flag")
        return flag

    def env(self, field: str) -> str | None:
        return self._by_field()[field].env

    def switch(self, field: str, on: bool) -> str:
        """The switch's spelling that turns it on, or off (`--kv-unified` / `--no-kv-unified`)."""
        setting = self._by_field()[field]
        word = setting.flag if on else setting.off
        if word is None:
            raise KeyError(f"{field} has no {'flag' if on else 'off spelling'}")
        return word

    def reader(self, field: str) -> ValueReader | None:
        """How an imported value of `field` reads (None: the field is not read from a launch line)."""
        setting = self._by_field().get(field)
        return setting.read if setting is not None else None

    def field_of_flag(self, flag: str) -> str | None:
        return next((s.field for s in self.entries if s.flag == flag), None)

    def field_of_env(self, env: str) -> str | None:
        return next((s.field for s in self.entries if s.env == env), None)

    def _by_field(self) -> dict[str, Setting]:
        return {s.field: s for s in self.entries}


@dataclass(frozen=True)
class Launch:
    """An engine's command line: the program words, then each option with its value(s), the environment it needs,
    and the plan features the engine has no flag for."""

    program: tuple[str, ...]
    options: tuple[tuple[str, ...], ...]
    env: dict[str, str]
    notes: tuple[str, ...]
    # Variables the engine reads a secret from, each filled from a file when it starts (never the secret itself).
    secret_files: dict[str, str] = field(default_factory=dict)

    @property
    def argv(self) -> list[str]:
        return [*self.program, *(word for option in self.options for word in option)]


def options(pairs: list[tuple[str, object]]) -> tuple[tuple[str, ...], ...]:
    """(flag, value) pairs as option words; a None value is a switch (the flag alone)."""
    return tuple((flag,) if value is None else (flag, str(value)) for flag, value in pairs)


class EngineAdapter(ABC):
    """One engine: Power's runtime, llama-server or vLLM."""

    # typed with the plan vocabulary's names, so a type check refuses an adapter named outside it
    name: EngineName
    # what `power plan` says when it sizes for this engine by default
    description: str
    settings: Settings
    # several devices: how the engine spreads a model over them (None: it runs on one device)
    multi_device: str | None = None
    # where the engine reads the API key clients must send: None, a file named by `--api-key-file`; else this
    # variable, which the launch fills from the key's file when it starts
    api_key_env: str | None = None
    # the option that leaves /metrics open to scrapers while every other route needs the key (None: no such choice)
    public_metrics_option: str | None = None
    # what the engine's image holds ready-made so a pod starts without building it: (the variable that points the
    # engine at it, the folder in the image, how the image fills that folder); None: nothing
    image_prebuilt: tuple[str, str, str] | None = None
    # the render targets that launch it (each a template `templates/<target>.j2`), its own command line first
    targets: tuple[str, ...] = ()
    # the target that renders its deployment's env file (`power bench --write-env`); None: it has none
    env_target: str | None = None
    # how `power bench` runs it as a live process (None: Power's runtime, measured in the bench's own process)
    live: LiveBench | None = None
    # how `power import ENGINE` reads its launch line (None: it has no launch line to import)
    launch_reader: LaunchReader | None = None
    # the engine refuses at load, on the CPU, weights the host cannot hold (PWR520): `power plan` judges the host too
    checks_host_memory: bool = False

    @abstractmethod
    def supports(self, asked: Asked) -> list[Refusal]:
        """What of `asked` this engine cannot run (its mode, its artifacts, its settings); empty when it can."""

    def target_refusals(self, target: ArtifactFacts, asked: Asked) -> list[Refusal]:  # noqa: ARG002
        """What of the target's shape this engine cannot run with `asked` (vLLM: heads that do not shard)."""
        return []

    def artifact_findings(self, artifact: ArtifactFacts) -> list[Finding]:  # noqa: ARG002
        """What the engine cannot load in a GGUF file it reads (the target, a GGUF drafter), located in that file
        (tensor types)."""
        return []

    @abstractmethod
    def size(self, target: ArtifactFacts, drafter: ArtifactFacts | None, request: Request,
             devices: tuple[DeviceBudget, ...]) -> Sizing:
        """The per-device breakdown of what the engine allocates for the request on `devices`."""

    def splits_layers(self, devices: int, request: Request) -> bool:  # noqa: ARG002
        """Whether a layer split may be searched for when the plan's does not fit (llama.cpp's `-ts`)."""
        return False

    def fitted(self, target: ArtifactFacts, drafter: ArtifactFacts | None, request: Request,
               devices: tuple[DeviceBudget, ...], limit: int) -> Sizing:
        """The breakdown at the request, with the largest context up to `limit` that fits and, when the plan's
        split does not fit, a layer split that does (engines that split layers)."""
        def size(asked: Request) -> Sizing:
            return self.size(target, drafter, asked, devices)

        sizing = size(request)
        split = None
        if sizing.verdict != "fits" and self.splits_layers(len(devices), request):
            split = fitting_split(size, request, len(devices), len(target.layers))
        return replace(sizing, max_ctx=largest_context(size, request, limit), fitting_split=split)

    @abstractmethod
    def launch(self, plan: ResolvedPlan, plan_path: Path, root: Path | None = None) -> Launch:
        """The command line that runs `plan` (refusals already asked for)."""

    def program_word(self, word: str) -> bool:  # noqa: ARG002
        """Whether a launch line's leading word names this engine's program (`power import` drops it)."""
        return False

    def stated_default(self, flag: str) -> str | None:  # noqa: ARG002
        """What the engine runs when its launch line leaves `flag` out, in words (`llama.cpp's default 48`), where
        its option table states it."""
        return None

    def env_names(self) -> EnvNames | None:
        """The variables the engine reads as options (`LLAMA_ARG_CTX_SIZE` is `--ctx-size`), or None."""
        return None

    def host_memory_bytes(self, plan: ResolvedPlan) -> int:  # noqa: ARG002
        """What the engine holds in host memory beyond the files it maps: nothing for engines that map the files
        and hold the rest on the device."""
        return 0

    def device_memory_fraction(self, plan: ResolvedPlan) -> float | None:  # noqa: ARG002
        """The share of each device the engine is told it may take (vLLM's --gpu-memory-utilization), or None."""
        return None
