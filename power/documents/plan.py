"""The resolved engine plan: the one document every downstream step takes.

A plan exists only when every check passed. It is immutable, carries a sha256
digest over its canonical content, and holds everything the runtime, the
renderers, the fleet review and the rollout need, so none of them re-reads TOML
or GGUF headers. Document shape (`schema = "power.plan/v1"`; JSON or TOML):

    schema      "power.plan/v1"
    name        the manifest's name
    sources     manifest / profile / host: {path, sha256} of the files compiled
    devices     [{index, name, kind, vram_bytes, headroom_bytes}]: the host's devices planned for
    target      {path, size, sha256, architecture, quant, n_layers, vocab_size,
                 context_length, has_mtp, recurrent_layers, source}; source (absent
                when the manifest names none): {repo, revision, filename} of a
                Hugging Face repository at a commit, or {url}
    mode        {requested, resolved, chain, reason}: the profile's spec_mode,
                what it resolved to (auto: verified external artifact -> native
                MTP -> none), the drafter chain in execution order
                (ngram first, then the one context-backed drafter), and why
    drafters    [{kind, path, size, sha256, target_sha256, contract, source, files}]: the
                drafters in the chain; `contract` holds header facts (block
                size, sliding window, target layers, layer count, ...); a
                drafter given as a Hugging Face checkpoint folder (vLLM) has
                `files` [{name, size, sha256}] and its sha256 is the digest of
                their `sha256sum` listing
    speculation {k, s, rollback, fr_vocab_size, adaptive, p_min}: rollback is "full"
                (S >= K), "guarded" (S < K: one exact replay, then clamp to S)
                or "none" (no speculation, and then K = S = 0)
    runtime     launch settings: ctx, batch, ubatch, slots, kv_unified, verify_capacity, arithmetic
                (Power's runtime: "quantised" or the "float32" reference, power.documents.arithmetic), gpu_layers,
                split_mode, tensor_split, main_gpu, tensor_parallel,
                flash_attn, cuda_graphs, kv_cache_type, draft_kv_cache_type,
                draft_device, ngram_match, ngram_draft_min, ngram_draft_max
    sampling    {temperature, seed, verify}: verify is "match" or "rejection"
    memory      the sizing for one engine: what each slot gets, per device the
                components (bytes, the header facts behind them, and whether
                each is exact to the engine, estimated or measured), its total,
                margin and verdict; host memory; the largest context that fits
    tokenizer   {vocab_size, merges, model, pre, sha256} of the target, or absent
    findings    every check result that did not stop the plan (warnings, info)
    digest      sha256 of the canonical JSON of everything above, file
                locations (`path`, `file`) left out: files count by sha256

The runtime reads these sections as they are (`power.runtime.engine.Workload`).
Because paths are outside the digest, whoever opens an artifact finds it with
`located` and checks its bytes against the plan's sha256
(`power.artifacts.verify`): run, serve, bench, render and verify all do.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Final, Literal

import tomli_w
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)

from power.artifacts.atomic import write_text_atomic
from power.artifacts.bounded_reader import (
    MAX_JSON_BYTES,
    DocumentError,
    check_structure,
    parse_json,
    parse_toml,
    read_text,
)
from power.artifacts.verify import TARGET, Artifact
from power.documents.arithmetic import Arithmetic
from power.findings import Finding, PowerError

# The engines Power has an adapter for (power.orchestrator.engines), as plans and profiles spell them.
EngineName = Literal["power", "llama-server", "vllm"]
# The engine a plan is sized for when neither the command, the deployment nor the profile names one.
DEFAULT_ENGINE: Final = "power"

PLAN_SCHEMA: Final = "power.plan/v1"


class PlanError(PowerError):
    """A plan file that cannot be used: unreadable, malformed, or edited after it was compiled."""

    code = "PWR080"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FileRef(_Frozen):
    path: str
    sha256: str


class Sources(_Frozen):
    manifest: FileRef
    profile: FileRef
    host: FileRef | None = None


class Device(_Frozen):
    index: int  # in the host's device list
    name: str
    vram_bytes: int
    headroom_bytes: int
    kind: Literal["gpu", "cpu"] = "gpu"


class Source(_Frozen):
    """Where an artifact is published, as its manifest names it: a Hugging Face repository at a commit (and the
    file in it), or a URL. Sealed with the plan, so `power verify` reports the provenance the plan was compiled with."""

    repo: str | None = None
    revision: str | None = None
    filename: str | None = None
    url: str | None = None

    @property
    def label(self) -> str:
        if self.url is not None:
            return self.url
        return f"hf://{self.repo}@{self.revision}" + (f"/{self.filename}" if self.filename else "")


class CheckpointFile(_Frozen):
    """One file of a drafter given as a Hugging Face checkpoint folder: its path in the folder, size, sha256."""

    name: str
    size: int
    sha256: str


class Target(_Frozen):
    path: str
    size: int
    sha256: str
    architecture: str
    quant: str
    n_layers: int
    vocab_size: int
    context_length: int | None = None
    has_mtp: bool = False
    # layers carrying recurrent state (what S snapshots); 0 for attention-only trunks
    recurrent_layers: int = 0
    source: Source | None = None


class Mode(_Frozen):
    requested: str
    resolved: str
    chain: tuple[str, ...]
    reason: str


# Header facts only; no None (TOML could not carry it back).
ContractValue = int | float | str | bool | tuple[int, ...]


class Drafter(_Frozen):
    kind: str
    path: str | None = None
    size: int | None = None
    sha256: str | None = None
    target_sha256: str | None = None
    contract: dict[str, ContractValue] = {}
    source: Source | None = None
    # a Hugging Face checkpoint folder (for vLLM): its files; `sha256` is then
    # `power.artifacts.checkpoint.listing_sha256`
    files: tuple[CheckpointFile, ...] | None = None

    @model_validator(mode="after")
    def _a_file_has_its_digest(self) -> Drafter:
        if self.path is not None and self.sha256 is None:
            raise ValueError("a drafter with a file must carry the file's sha256")
        if self.path is None and self.sha256 is not None:
            # The sha256 is sealed, the path is not: a path set to null or removed must not drop the file.
            raise ValueError("a drafter sealed with a file's sha256 must name the file's path")
        return self


class Speculation(_Frozen):
    k: int
    s: int
    rollback: Literal["full", "guarded", "none"]
    fr_vocab_size: int | None = None
    adaptive: bool = False
    # the confidence a drafted position needs (DSpark's gate: the profile's, else the header's threshold)
    p_min: float | None = None


class Runtime(_Frozen):
    ctx: int
    batch: int
    ubatch: int = 512  # micro-batch (llama.cpp -ub)
    slots: int = 1  # parallel sequences (llama-server -np)
    kv_unified: bool = False  # one KV cache shared by the slots; else each slot has ctx / slots cells
    verify_capacity: int
    arithmetic: (
        Arithmetic  # Power's runtime's matrix products (power.documents.arithmetic); llama.cpp and vLLM have their own
    )
    gpu_layers: int | Literal["all"]
    # several devices: llama.cpp -sm / -ts (one ratio per device, in the plan's device order) / -mg; vLLM TP
    split_mode: Literal["layer", "none"] = "layer"
    tensor_split: tuple[float, ...] | None = None
    main_gpu: int = 0
    tensor_parallel: int = 1
    flash_attn: bool | Literal["auto"]  # auto: llama.cpp's default (flash_attention_on)
    cuda_graphs: bool
    kv_cache_type: str
    draft_kv_cache_type: str
    # the drafter's device as llama-server names it (`CUDA1`: the plan's second device, which the render makes
    # CUDA device 1); None: the drafter follows the target's devices (llama.cpp's default for --spec-draft-device)
    draft_device: str | None = None
    # the drafter's layers offloaded (llama-server --spec-draft-ngl)
    draft_gpu_layers: int | Literal["all"] = "all"
    # drafter tensors placed by name, `PATTERN=CPU` or `PATTERN=CUDA<n>` (llama-server --spec-draft-override-tensor)
    draft_override_tensor: tuple[str, ...] = ()
    # n-gram (None without one in the chain): the tokens its lookup matches, the shortest draft it keeps, the longest
    ngram_match: int | None = None
    ngram_draft_min: int | None = None
    ngram_draft_max: int | None = None


    @model_serializer(mode="wrap")
    def _sealed_before_draft_layers(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """`draft_gpu_layers` and `draft_override_tensor` came after plans were sealed: left at their defaults they are
        not written, so a plan sealed before keeps its digest (a missing key reads back as the default)."""
        data = handler(self)
        for key, default in (("draft_gpu_layers", "all"), ("draft_override_tensor", ())):
            if key in data and data[key] in (default, list(default) if isinstance(default, tuple) else default):
                del data[key]
        return data


class Sampling(_Frozen):
    temperature: float
    seed: int
    verify: Literal["match", "rejection"]


class MemoryComponent(_Frozen):
    name: str
    bytes: int
    detail: str
    # exact: the engine's allocation rule, checked against the engine; estimated: a documented model; measured: a run
    basis: Literal["exact", "estimated", "measured"] = "exact"


class DeviceMemory(_Frozen):
    index: int  # in the host's device list
    name: str
    device_bytes: int
    headroom_bytes: int
    holds: str  # the layers placed here
    components: tuple[MemoryComponent, ...]
    total_bytes: int
    # device_bytes - headroom_bytes - total_bytes; negative when over the headroom line
    margin_bytes: int
    verdict: Literal["fits", "fits-below-headroom", "does-not-fit"]


class MemorySlots(_Frozen):
    """What each parallel sequence gets, as the engine derives it."""

    slots: int
    kv_unified: bool
    engine_ctx: int  # the engine's whole context after its padding
    ctx_per_slot: int
    kv_streams: int
    sliding_cells: int | None = None  # per stream, of a sliding-window cache
    batch: int  # after the engine's clamping
    ubatch: int
    outputs: int  # logits rows reserved per decode


class Memory(_Frozen):
    engine: EngineName
    ctx: int
    slots: MemorySlots
    devices: tuple[DeviceMemory, ...]
    host: tuple[MemoryComponent, ...] = ()  # host memory: the input layer, the output buffer, ... (no verdict)
    total_bytes: int  # over the devices
    margin_bytes: int  # the smallest device margin
    verdict: Literal["fits", "fits-below-headroom", "does-not-fit"]  # the worst device's
    max_ctx: int | None = None

    @property
    def components(self) -> tuple[MemoryComponent, ...]:
        """Every device's components, in device order (host memory apart)."""
        return tuple(c for device in self.devices for c in device.components)


class Tokenizer(_Frozen):
    vocab_size: int
    merges: int
    model: str
    pre: str | None = None
    sha256: str


class FindingRecord(_Frozen):
    code: str
    severity: Literal["error", "warning", "info"]
    message: str
    file: str | None = None
    line: int | None = None
    col: int | None = None
    offset: int | None = None
    where: str | None = None
    hint: str | None = None

    @classmethod
    def of(cls, finding: Finding) -> FindingRecord:
        # Where, not how wide (the caret's end_col is for display); a plan holds warnings and info, never an
        # artifact's errors, so `declared_at` has no place here either.
        return cls(**{key: value for key, value in finding.to_json().items() if key in cls.model_fields})


class ResolvedPlan(_Frozen):
    schema_: Literal["power.plan/v1"] = Field(PLAN_SCHEMA, alias="schema")
    name: str
    sources: Sources
    devices: tuple[Device, ...]
    target: Target
    mode: Mode
    drafters: tuple[Drafter, ...]
    speculation: Speculation
    runtime: Runtime
    sampling: Sampling
    memory: Memory
    tokenizer: Tokenizer | None = None
    findings: tuple[FindingRecord, ...] = ()
    digest: str = ""

    # `schema` would shadow a BaseModel attribute: the field is `schema_`, spelled `schema` in the document.
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @classmethod
    def build(cls, **content: Any) -> ResolvedPlan:
        """A plan from its sections, with its digest computed.

        DocumentError when a number in it leaves 64 bits (sizes computed from absurd header values):
        such a plan could be written but never read back (TOML integers are 64-bit).
        """
        unsigned = cls(**content)
        check_structure(unsigned.document())
        return unsigned.model_copy(update={"digest": content_digest(unsigned)})

    def document(self) -> dict[str, Any]:
        """The plan as plain JSON data, in document order (`schema` first). An artifact without a `source` has no
        such key, so a plan of unsourced artifacts keeps the digest it had before sources existed."""
        data = self.model_dump(mode="json", by_alias=True)
        for artifact in (data["target"], *data["drafters"]):
            for key in ("source", "files"):
                if artifact.get(key) is None:
                    artifact.pop(key, None)
        return data


def canonical_json(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def content_digest(plan: ResolvedPlan) -> str:
    """sha256 over the canonical JSON of every section except the digest itself and file locations.

    Files are identified by their sha256, not by where they lie, so the same
    fleet checked out at another path compiles to the same digests; a path
    edited by hand is caught when the runtime re-hashes the artifact it names.
    """
    content = _without_locations(plan.document())
    content.pop("digest")
    return hashlib.sha256(canonical_json(content)).hexdigest()


def _without_locations(data: Any) -> Any:
    if isinstance(data, dict):
        return {key: _without_locations(value) for key, value in data.items() if key not in _LOCATION_KEYS}
    if isinstance(data, list):
        return [_without_locations(item) for item in data]
    return data


_LOCATION_KEYS = frozenset({"path", "file"})


def located(plan: ResolvedPlan, plan_path: Path, root: Path | None = None) -> ResolvedPlan:
    """The plan with every artifact path where this machine opens it (the digest is unchanged: paths are outside it).

    Without `root`, a relative path is relative to the plan file's folder and an absolute path
    stays as it is. With `root`, every artifact is looked for in `root` by its file name (a
    container mounts the models there): the sha256 still decides whether it is the planned file.
    """
    def where(path: str) -> str:
        if root is not None:
            return str(Path(root) / Path(path).name)
        return path if Path(path).is_absolute() else str(Path(plan_path).parent / path)

    drafters = tuple(d if d.path is None else d.model_copy(update={"path": where(d.path)}) for d in plan.drafters)
    return plan.model_copy(update={"target": plan.target.model_copy(update={"path": where(plan.target.path)}),
                                   "drafters": drafters})


def flash_attention_on(setting: bool | str) -> bool:
    """Whether the engine builds the target's attention for flash attention. `auto`, llama.cpp's default, does: it
    sets `cparams.flash_attn = flash_attn_type != LLAMA_FLASH_ATTN_TYPE_DISABLED` before it makes the KV cache (its V
    rows untransposed, unpadded) and keeps the op on wherever the device runs it (src/llama-context.cpp)."""
    return setting is not False


def planned_artifacts(plan: ResolvedPlan) -> tuple[Artifact, ...]:
    """Every file the plan names, with the size and sha256 it was compiled with: the target, then each drafter's."""
    target = Artifact(TARGET, Path(plan.target.path), plan.target.sha256, plan.target.size, _label(plan.target.source))
    return (target, *(artifact for d in plan.drafters if d.path is not None for artifact in _drafter_files(d)))


def _drafter_files(drafter: Drafter) -> tuple[Artifact, ...]:
    """A drafter's file, or each file of its checkpoint folder."""
    assert drafter.path is not None
    label = _label(drafter.source)
    if drafter.files is None:
        return (Artifact(drafter.kind, Path(drafter.path), drafter.sha256, drafter.size, label),)
    return tuple(Artifact(drafter.kind, Path(drafter.path) / f.name, f.sha256, f.size,
                          f"{label}/{f.name}" if label else None) for f in drafter.files)


def _label(source: Source | None) -> str | None:
    return source.label if source is not None else None


def to_json(plan: ResolvedPlan) -> str:
    return json.dumps(plan.document(), indent=2, ensure_ascii=False) + "\n"


def to_toml(plan: ResolvedPlan) -> str:
    return tomli_w.dumps(_without_nulls(plan.document()))


def save_plan(plan: ResolvedPlan, path: Path) -> None:
    """Write the plan atomically: TOML for a `.toml` path, JSON otherwise."""
    path = Path(path)
    write_text_atomic(path, to_toml(plan) if path.suffix == ".toml" else to_json(plan))


def load_plan(path: Path) -> ResolvedPlan:
    """Read a plan (JSON or TOML) and verify its digest; PlanError says what is wrong and what to do."""
    path = Path(path)
    data = _read_document(path)
    if data.get("schema") != PLAN_SCHEMA:
        raise PlanError(f"not a Power plan (schema is {data.get('schema')!r}, expected {PLAN_SCHEMA!r})",
                        file=str(path),
                        hint="compile one with `power plan MANIFEST PROFILE --device ... -o plan.json`")
    try:
        plan = ResolvedPlan.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise PlanError(f"{where}: {first['msg']}", code="PWR081", file=str(path),
                        hint="recompile the plan with `power plan`") from None
    coerced = _first_coercion(data, plan.document())
    if coerced is not None:
        raise PlanError(f"{'.'.join(str(part) for part in coerced)}: the value is not written as `power plan` writes "
                        "it (a type changed, e.g. a number quoted): the plan was edited after it was compiled",
                        code="PWR081", file=str(path), hint="recompile the plan with `power plan`")
    expected = content_digest(plan)
    if plan.digest != expected:
        raise PlanError(f"digest mismatch (file says {plan.digest[:16]}..., content hashes to {expected[:16]}...): "
                        "the plan was edited after it was compiled", code="PWR082", file=str(path),
                        hint="change the manifest or profile and recompile with `power plan` "
                             "instead of editing the plan")
    return plan


def _read_document(path: Path) -> dict[str, Any]:
    try:
        text = read_text(path, MAX_JSON_BYTES)
        data = parse_toml(text) if path.suffix == ".toml" else parse_json(text)
    except DocumentError as err:
        raise PlanError.of(err.finding("PWR080", path, "pass a plan written by `power plan -o`, or recompile it",
                                       what="the plan")) from None
    if not isinstance(data, dict):
        raise PlanError("a plan is a JSON object", code="PWR081", file=str(path),
                        hint="recompile the plan with `power plan`")
    return data


def _first_coercion(written: Any, read: Any, where: tuple[str | int, ...] = ()) -> tuple[str | int, ...] | None:
    """Where a value in the file differs from the value the plan holds after validation (`"3"` read as 3, `1` as
    true): the digest is over the validated values, so such an edit would keep the seal. None when there is none."""
    if isinstance(written, dict) and isinstance(read, dict):
        return next((found for key, value in written.items() if key in read
                     if (found := _first_coercion(value, read[key], (*where, key))) is not None), None)
    if isinstance(written, list) and isinstance(read, list) and len(written) == len(read):
        return next((found for index, (a, b) in enumerate(zip(written, read, strict=True))
                     if (found := _first_coercion(a, b, (*where, index))) is not None), None)
    return None if canonical_json(written) == canonical_json(read) else where


def _without_nulls(value: Any) -> Any:
    """TOML has no null: absent keys load back as None, so the digest is unchanged."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value
