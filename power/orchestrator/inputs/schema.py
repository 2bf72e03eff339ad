"""The four file kinds users write — manifest, profile, host, fleet — as pydantic v2 models.

Every model forbids unknown keys and checks each field on its own (types, ranges,
units, digests). Rules that relate several fields (S vs K, FR vs mode, a drafter
kind that needs a file) live in `power.orchestrator.inputs.rules`, and
`power.orchestrator.inputs.loading` runs both, so load files through it.

Paths are resolved against the directory of the file that names them: pass
`context={"base_dir": <that directory>}` to `model_validate` (the loader does).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationInfo,
    WithJsonSchema,
    model_validator,
)

from power import modes
from power.documents import arithmetic, kv_types
from power.documents.plan import DEFAULT_ENGINE, EngineName
from power.orchestrator.inputs.units import ACCEPTED_FORMS, MAX_BYTES, parse_device_size, parse_size

SCHEMA_VERSION = "v1"
DEFAULT_HEADROOM = 512 * 1024**2
DEFAULT_DRAFT_MAX = 7  # K, a profile's proposal width, when it sets no spec_draft_max
# Upper bounds where a value stops making physical sense (docs/files.md lists them): far above any real
# deployment, low enough that no size computed from them leaves 64 bits.
MAX_CTX = 1 << 26  # 67,108,864 tokens
MAX_ROWS = 4096  # verification rows, rollback snapshots
MAX_LAYERS = 1 << 16
MAX_VOCAB = 1 << 24
MAX_NGRAM = 1024
MAX_DEVICES = 256  # devices one deployment spans (llama.cpp's GGML_CUDA_MAX_DEVICES is 16)


# The modes and drafter kinds, spelled as `power.modes` defines them (one record per mode).
SpecModeName = Literal[modes.SPEC_MODES]  # type: ignore[valid-type]  # pyright: ignore[reportInvalidTypeForm]
DrafterKindName = Literal[modes.DRAFTER_KINDS]  # type: ignore[valid-type]  # pyright: ignore[reportInvalidTypeForm]

# Keys as llama.cpp (or an older Power) spells them -> Power's key; a file using one gets PWR026, never a silent ignore.
RENAMED_KEYS = {
    "spec_type": "spec_mode",
    "spec_draft_n_max": "spec_draft_max",
    "draft_max": "spec_draft_max",
    "n_ctx": "ctx",
    "ctx_size": "ctx",
    "n_gpu_layers": "gpu_layers",
    "ngl": "gpu_layers",
    "flash_attention": "flash_attn",
    "cache_type_k": "kv_cache_type",
    "temp": "temperature",
    "spec_ngram_mod_n_match": "ngram_match",
    "spec_ngram_mod_n_min": "ngram_draft_min",
    "spec_ngram_mod_n_max": "ngram_draft_max",
    "ngram_n_min": "ngram_match",  # Power's former match-length range: the lookup now matches one length
    "ngram_n_max": "ngram_match",
    "draft_p_min": "spec_draft_p_min",
    "n_parallel": "slots",
    "parallel": "slots",
    "batch_size": "batch",
    "ubatch_size": "ubatch",
}

SplitMode = Literal["layer", "none"]
DeviceKind = Literal["gpu", "cpu"]
KvCacheType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
VerifyRule = Literal["match", "rejection"]
ArithmeticName = Literal[arithmetic.REQUESTABLE]  # type: ignore[valid-type]  # pyright: ignore[reportInvalidTypeForm]
TrafficShape = Literal["prose", "echo", "structured", "identity"]


def _resolve_against_file(path: Path, info: ValidationInfo) -> Path:
    if str(path) in ("", "."):
        raise ValueError("a path cannot be empty")
    base_dir = (info.context or {}).get("base_dir")
    if base_dir is not None and not path.is_absolute():
        path = Path(base_dir) / path
    if base_dir is None:
        return path
    try:
        return Path(path).expanduser().resolve()
    except (RuntimeError, OSError) as err:  # a symlink loop (RuntimeError before Python 3.13), an unreadable home
        raise ValueError(f"the path {str(path)!r} cannot be resolved ({err}); point it at the file itself") from None


def _lower(text: str) -> str:
    return text.lower()


Bytes = Annotated[
    int,
    BeforeValidator(parse_size),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 0, "maximum": MAX_BYTES},
                {"type": "string", "pattern": r"^\s*\d[\d_]*(\.\d+)?\s*(([kKmMgGtT][iI]?)?B)?\s*$"},
            ],
            "description": f"a size: {ACCEPTED_FORMS}",
        }
    ),
]
Sha256 = Annotated[StrictStr, Field(pattern=r"^[0-9a-fA-F]{64}$"), AfterValidator(_lower)]
FilePath = Annotated[Path, AfterValidator(_resolve_against_file), WithJsonSchema({"type": "string", "format": "path"})]


# A name reaches renders (comments, systemd units, labels, env files): no control characters (a NUL cannot be
# written into a systemd unit at all, a line break ends a comment).
NAME_PATTERN = r"^[^\x00-\x1f\x7f]+$"


class _Strict(BaseModel):
    # defer_build: a model builds its validator on first use, so `power validate` on profiles never builds a fleet's.
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, defer_build=True)


def _schema_field(kind: str):
    schema_id = f"power.{kind}/{SCHEMA_VERSION}"
    return Field(alias="schema", description=f'the file kind and version: "{schema_id}"')


# --- manifest -----------------------------------------------------------------


# A Hugging Face repository id, "owner/name" (the Hub's own rule: letters, digits, `-`, `_`, `.`).
HUB_REPO_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$"
# A git commit id as the Hub reports it: what a pinned revision is.
COMMIT_PATTERN = r"^[0-9a-f]{40}$"


class SourceEntry(_Strict):
    """Where an artifact is published: a Hugging Face repository at a commit, or a plain HTTPS URL
    (the rules in `power.orchestrator.inputs.rules` relate the keys; `power pull` fetches from it)."""

    repo: StrictStr | None = Field(None, pattern=HUB_REPO_PATTERN,
                                   description='a Hugging Face repository, "owner/name"')
    revision: StrictStr | None = Field(None, min_length=1, description="the repository commit (40 hex digits); a "
                                       "branch or tag is resolved to its commit and written back by `power pull --pin`")
    filename: StrictStr | None = Field(None, min_length=1, description="the file's path in the repository; default: "
                                       "the artifact's file name")
    url: StrictStr | None = Field(None, pattern=r"^[hH][tT][tT][pP][sS]?://", description="a plain https:// URL "
                                  "instead of a repository")


class TargetEntry(_Strict):
    path: FilePath = Field(description="the target GGUF, relative to this manifest")
    size: Bytes | None = Field(None, description="the file's size in bytes, checked against the file")
    sha256: Sha256 | None = Field(None, description="the file's sha256 (64 hex digits), checked against the file; "
                                  "required (`power pull --pin` writes it for an artifact with a source)")
    source: SourceEntry | None = Field(None, description="where the target is published (`power pull` fetches it)")
    quant: StrictStr | None = Field(None, description="the quantisation the header must declare, e.g. Q6_K, Q4_K_M")
    architecture: StrictStr | None = Field(None, description="general.architecture the header must "
                                                             "declare, e.g. qwen35, gemma3")


def _inside_folder(name: str) -> str:
    if name.startswith("/") or ".." in name.split("/"):
        raise ValueError(f"{name!r} leaves the checkpoint folder: name a path inside it, e.g. config.json")
    return name


class CheckpointFile(_Strict):
    """One file of a drafter published as a Hugging Face checkpoint folder."""

    name: Annotated[StrictStr, AfterValidator(_inside_folder)] = Field(
        min_length=1, pattern=NAME_PATTERN, description="the file's path inside the checkpoint folder (and the "
        "repository), e.g. config.json, model.safetensors, tokenizer.json")
    size: Bytes | None = Field(None, description="the file's size in bytes")
    sha256: Sha256 | None = Field(None, description="the file's sha256 (64 hex digits)")


class DrafterEntry(_Strict):
    kind: DrafterKindName = Field(description=" | ".join(modes.DRAFTER_KINDS) + "; the artifact's header must agree")
    path: FilePath | None = Field(None, description=f"the drafter GGUF ({', '.join(sorted(modes.FILE_BACKED))}); mtp "
                                                    "lives in the target, ngram needs none")
    size: Bytes | None = Field(None, description="the drafter file's size in bytes")
    sha256: Sha256 | None = Field(None, description="the drafter file's sha256 (64 hex digits)")
    target_sha256: Sha256 | None = Field(None, description="the sha256 of the target this drafter was "
                                                           "built for: the binding")
    quant: StrictStr | None = Field(None, description="the drafter's quantisation, e.g. Q4_K_M")
    source: SourceEntry | None = Field(None, description="where the drafter is published (`power pull` fetches it)")
    files: list[CheckpointFile] | None = Field(None, min_length=1, description="a drafter that is a Hugging Face "
                                               "checkpoint (for vLLM): `path` names its folder and each file here "
                                               "carries its size and sha256; config.json is required")


class Manifest(_Strict):
    schema_id: Literal["power.manifest/v1"] = _schema_field("manifest")
    name: StrictStr = Field(min_length=1, pattern=NAME_PATTERN, description="the manifest's name")
    description: StrictStr | None = Field(None, description="free text")
    target: TargetEntry
    drafters: list[DrafterEntry] = Field(default_factory=list, description="the drafters available for this target")


# --- profile ------------------------------------------------------------------


class ProfileRuntime(_Strict):
    ctx: StrictInt = Field(4096, ge=1, le=MAX_CTX, description=f"context length in tokens (at most {MAX_CTX:,})")
    verify_capacity: StrictInt | None = Field(
        None, ge=1, le=MAX_ROWS,
        description=f"fixed target verification shape in rows (B11 = 11); at least K+1, at most {MAX_ROWS}; default K+1"
    )
    batch: StrictInt = Field(2048, ge=1, le=MAX_CTX,
                             description="logical batch: most prompt tokens per decode call (llama.cpp -b)")
    ubatch: StrictInt = Field(512, ge=1, le=MAX_CTX, description="micro-batch: tokens per graph evaluation (llama.cpp "
                                                                 "-ub); the compute buffer is sized for it")
    slots: StrictInt = Field(1, ge=1, le=256, description="parallel sequences the engine serves at "
                                                          "once (llama-server -np)")
    kv_unified: StrictBool = Field(False, description="one KV cache shared by every slot (llama-server --kv-unified) "
                                                      "instead of ctx / slots cells per slot")
    cuda_graphs: StrictBool = Field(True, description="capture CUDA graphs for the fixed shapes")
    flash_attn: StrictBool | Literal["auto"] = Field(False, description="flash attention for the "
                                                     "target: true, false or \"auto\" (llama.cpp's default: on "
                                                     "where the device runs it)")
    kv_cache_type: KvCacheType = Field(kv_types.DEFAULT, description="KV cache element type (llama.cpp names)")
    arithmetic: ArithmeticName = Field(
        arithmetic.AUTO, description='Power\'s runtime\'s matrix products: "quantised" (weights kept quantised, '
        'integer products with exact sums; each forward runs on its real rows), "float32" (the reference: exactly '
        'dequantised weights, forwards padded to the fixed shape) or "auto" (the fastest exact arithmetic: quantised)')
    gpu_layers: Annotated[StrictInt, Field(ge=0, le=MAX_LAYERS)] | Literal["all"] = Field(
        "all", description=f'layers offloaded to the GPU: an integer from 0 to {MAX_LAYERS} or "all" (full offload)')
    split_mode: SplitMode = Field("layer", description='several devices under llama-server: "layer" (each device a run '
                                                       'of layers, -sm layer) or "none" (the main '
                                                       'device only, -sm none)')
    tensor_split: list[StrictInt | Annotated[StrictFloat, Field(allow_inf_nan=False)]] | None = Field(
        None, max_length=MAX_DEVICES, description="each device's share of the layers (llama-server "
                                                  "-ts), one ratio >= 0 per device of the deployment; default: each "
                                                  "device's memory after the headroom")
    main_gpu: StrictInt = Field(0, ge=0, lt=MAX_DEVICES, description="with split_mode none: which of the deployment's "
                                                                     "devices runs the model "
                                                                     "(llama-server -mg), counted in the "
                                                                     "deployment's device list")
    draft_kv_cache_type: KvCacheType | None = Field(None, description="the drafter's KV cache element type "
                                                    "(llama-server --spec-draft-type-k/-v); default kv_cache_type")
    draft_device: StrictInt | None = Field(None, ge=0, lt=MAX_DEVICES, description="the deployment's GPU the drafter "
                                           "runs on (llama-server --spec-draft-device), counted in the deployment's "
                                           "device list from 0; default: the target's devices, split as the target")
    draft_override_tensor: list[StrictStr] | None = Field(
        None, max_length=64, description="drafter tensors placed by name (llama-server --spec-draft-override-tensor): "
        "each \"PATTERN=CPU\" (host memory) or \"PATTERN=CUDA<n>\" (the deployment's device n), the pattern a regular "
        "expression searched in each tensor name, the first match wins")
    draft_gpu_layers: Annotated[StrictInt, Field(ge=0, le=MAX_LAYERS)] | Literal["all"] = Field(
        "all", description=f'the drafter\'s layers offloaded to its device(s) (llama-server --spec-draft-ngl): an '
                           f'integer from 0 to {MAX_LAYERS} or "all"')
    tensor_parallel: StrictInt = Field(1, ge=1, le=MAX_DEVICES, description="vLLM --tensor-parallel-size: each layer "
                                                                            "sharded over this many devices (the "
                                                                            "deployment's device count)")
    ngram_match: StrictInt = Field(24, ge=1, le=MAX_NGRAM, description="n-gram speculation: how many "
                                   "trailing tokens the lookup matches (llama.cpp --spec-ngram-mod-n-match)")
    ngram_draft_min: StrictInt = Field(1, ge=1, le=MAX_NGRAM, description="n-gram speculation: a "
                                       "draft shorter than this is dropped (llama.cpp --spec-ngram-mod-n-min)")
    ngram_draft_max: StrictInt | None = Field(None, ge=1, le=64, description="n-gram speculation: the longest draft "
                                              "(llama.cpp --spec-ngram-mod-n-max); default K (spec_draft_max)")


class SamplingSettings(_Strict):
    temperature: StrictFloat = Field(0.0, ge=0.0, allow_inf_nan=False, description="0 is greedy; > 0 samples (finite)")
    seed: StrictInt = Field(0, ge=0, description="seed of the counter-based sampling stream")
    verify: VerifyRule = Field("match", description='"match" (seeded stream equal to autoregressive) or '
                                                    '"rejection" (Leviathan/Chen)')


class Profile(_Strict):
    schema_id: Literal["power.profile/v1"] = _schema_field("profile")
    name: StrictStr = Field(min_length=1, pattern=NAME_PATTERN, description="the profile's name")
    description: StrictStr | None = Field(None, description="free text")
    spec_mode: SpecModeName = Field(modes.AUTO, description=" | ".join(modes.SPEC_MODES))
    spec_draft_max: StrictInt = Field(
        DEFAULT_DRAFT_MAX, ge=1, le=64, description="K, the proposal width: an integer from 1 to 64"
    )
    spec_mtp_recurrent_snapshots: StrictInt = Field(
        7, ge=1, le=MAX_ROWS, description=f"S, the resident rollback window: an integer from 1 to {MAX_ROWS}")
    spec_mtp_fr_vocab_size: StrictInt | None = Field(
        None, ge=1, le=MAX_VOCAB,
        description=f"FR, the draft head's token-ID prefix: an integer from 1 to {MAX_VOCAB:,} (omit for "
                    "the full vocabulary)"
    )
    spec_draft_p_min: StrictFloat | None = Field(
        None, ge=0.0, le=1.0, description="the confidence a drafted position needs (llama.cpp --spec-draft-p-min; "
        "DSpark's gate); omit for the drafter's own threshold"
    )
    spec_mtp_adaptive: StrictBool = Field(False, description="the adaptive controller (mtp, dflash, "
                                                             "dspark; not dflash2)")
    runtime: ProfileRuntime = Field(default_factory=ProfileRuntime)
    sampling: SamplingSettings = Field(default_factory=SamplingSettings)
    engine: EngineName | None = Field(None, description="the engine these settings were written for (`power import` "
                                      "records the launch line's): `power plan`, `power size` and a fleet deployment "
                                      "without `engine` size for it; default power (Power's runtime)")

    @property
    def verify_rows(self) -> int:
        """The fixed verification shape: `runtime.verify_capacity`, or K+1 when unset."""
        return self.runtime.verify_capacity or self.spec_draft_max + 1


# --- host and fleet -------------------------------------------------------------

# A device's memory: a size of at least 1 MiB (a bare `24` is 24 B, refused with the fix).
DeviceBytes = Annotated[int, BeforeValidator(parse_device_size), WithJsonSchema(
    {"anyOf": [{"type": "integer", "minimum": 1024**2, "maximum": MAX_BYTES},
               {"type": "string", "pattern": r"^\s*\d[\d_]*(\.\d+)?\s*(([kKmMgGtT][iI]?)?B)?\s*$"}],
     "description": f"a device's memory, at least 1 MiB: {ACCEPTED_FORMS}"})]


class DeviceSpec(_Strict):
    model: StrictStr = Field(min_length=1, description='the device model, e.g. "RTX 4090"')
    vram: DeviceBytes = Field(description='device memory, e.g. "24 GiB" (for a cpu device: the RAM the engine may use)')
    kind: DeviceKind = Field("gpu", description='"gpu" (an accelerator) or "cpu" (the engine runs on the host\'s CPU '
                                                'and memory)')


# An engine's container image, e.g. "ghcr.io/ggml-org/llama.cpp:server-cuda-b9180" (Power builds none).
Image = Annotated[StrictStr, Field(min_length=1, pattern=r"^\S+$")]
EngineImages = dict[EngineName, Image]


class Toleration(_Strict):
    key: StrictStr | None = Field(None, description='the taint key, e.g. "nvidia.com/gpu" (omit with operator '
                                                    '"Exists" for every taint)')
    operator: Literal["Equal", "Exists"] = Field("Equal", description="Equal (key and value match) | "
                                                                      "Exists (the key alone)")
    value: StrictStr | None = Field(None, description="the taint value, for operator Equal")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="the taint effect (omit: every effect)"
    )
    toleration_seconds: StrictInt | None = Field(None, ge=0, description="NoExecute only: how long the "
                                                                         "pod stays once tainted")


class HostKubernetes(_Strict):
    node_name: StrictStr | None = Field(None, min_length=1, description="the node's name (its "
                                                                        "kubernetes.io/hostname label)")
    node_selector: dict[str, StrictStr] = Field(
        default_factory=dict, description='node labels the pod requires, e.g. { '
                                          '"nvidia.com/gpu.product" = "NVIDIA-L4" }')
    tolerations: list[Toleration] = Field(
        default_factory=list, description="taints of the host's nodes the pod tolerates"
    )
    images: EngineImages = Field(default_factory=dict, description="engine images on this host, over the fleet's "
                                                                   "[kubernetes.images]")


class HostSpec(_Strict):
    name: StrictStr = Field(min_length=1, pattern=NAME_PATTERN, description="the host's name")
    devices: list[DeviceSpec] = Field(min_length=1, description='the accelerators, e.g. [{ model = "RTX '
                                                                '4090", vram = "24 GiB" }]')
    headroom: Bytes = Field(DEFAULT_HEADROOM, description="memory kept free on each device (default 512 MiB)")
    labels: dict[str, StrictStr] = Field(default_factory=dict, description="free-form labels, e.g. { zone = \"lab\" }")
    kubernetes: HostKubernetes | None = Field(None, description="where the host's deployments run in a cluster "
                                                               "(`power fleet render --target kubernetes`)")


class Host(HostSpec):
    schema_id: Literal["power.host/v1"] = _schema_field("host")


class Deployment(_Strict):
    name: StrictStr | None = Field(None, min_length=1, pattern=NAME_PATTERN,
                                   description="the deployment's name on its host (default: the manifest's name)")
    host: StrictStr = Field(min_length=1, description="the name of a host in this fleet")
    device: StrictInt = Field(0, ge=0, description="the index of the host's device the deployment runs on (default 0)")
    devices: list[Annotated[StrictInt, Field(ge=0)]] | None = Field(
        None, min_length=1, max_length=MAX_DEVICES, description="several of the host's devices (by index) for one "
                                        "deployment: a llama-server layer split or vLLM tensor "
                                        "parallelism; instead of `device`")
    manifest: FilePath = Field(description="the manifest file, relative to this fleet file")
    profile: FilePath = Field(description="the profile file, relative to this fleet file")
    traffic: TrafficShape = Field("prose", description="the traffic shape the deployment serves: prose | echo | "
                                                       "structured | identity")
    engine: EngineName | None = Field(None, description="the engine the deployment runs: power (Power's runtime, "
                                      "`power serve`) | llama-server | vllm; default: its profile's `engine`, else "
                                      "power")
    volume: StrictStr | None = Field(None, min_length=1, description="the [kubernetes.volumes] entry holding the "
                                                                     "deployment's model files (default: the only one)")
    api_key_secret: StrictStr | None = Field(
        None, pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$",
        description="the Kubernetes Secret (its key `api-key`) holding the API key clients must send; the render "
                    "mounts it into the engine, never reads it")
    exactness: Literal["exact", "near-tie"] = Field(
        "exact", description="what a rollout's gate accepts of greedy outputs: exact (identical to the incumbent's) | "
                             "near-tie (they may differ where the target's own top two tokens are within "
                             "near_tie_margin nats, read without speculation: a live engine's arithmetic)")
    near_tie_margin: float = Field(0.1, gt=0, le=5, description="nats: the widest gap between the target's own "
                                                                "log-probabilities of two tokens a near-tie may have")
    concurrency: StrictInt = Field(1, ge=1, le=1024, description="the clients the deployment serves at once: a "
                                   "rollout's gate judges the candidate at that many (`power bench --concurrency`)")


    @model_validator(mode="after")
    def _one_placement(self) -> Deployment:
        if self.devices is not None and "device" in self.model_fields_set:
            raise ValueError("name `device` (one device) or `devices` (several), not both")
        if self.devices is not None and len(set(self.devices)) != len(self.devices):
            raise ValueError(f"devices {self.devices} names a device twice")
        return self

    @property
    def device_indices(self) -> tuple[int, ...]:
        """The host device indices the deployment runs on, in order."""
        return tuple(self.devices) if self.devices is not None else (self.device,)

    @property
    def runs_on(self) -> EngineName:
        """The engine the deployment runs (the fleet review fills in its profile's when it names none)."""
        return self.engine or DEFAULT_ENGINE


class ModelVolume(_Strict):
    host_path: StrictStr | None = Field(None, pattern=r"^/", description="the folder on every node holding "
                                                                         "the files (hostPath)")
    claim: StrictStr | None = Field(None, min_length=1, description="the PersistentVolumeClaim holding the files")
    empty_dir: StrictBool = Field(False, description="an emptyDir the pod's `pull` init container fills (needs "
                                  "pull = true)")
    pull: StrictBool = Field(False, description="an init container runs `power pull` on the plan into the volume "
                             "(each artifact from its manifest source, checked by size and sha256) before `power "
                             "verify`, so the volume needs no pre-filling")
    token_secret: StrictStr | None = Field(None, pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$",
                                           description="with pull: the Kubernetes Secret whose key `token` the pull "
                                           "reads as HF_TOKEN (a gated or private repository); the render never "
                                           "reads it")
    local: FilePath = Field(description="the folder, relative to this file, whose copy the volume holds: a planned "
                                        "artifact path under it is the same path under mount_path in the pod")
    mount_path: StrictStr = Field("/models", pattern=r"^/", description="where the pod sees the volume (read-only "
                                  "to the engine)")

    @model_validator(mode="after")
    def _one_source(self) -> ModelVolume:
        if sum((self.host_path is not None, self.claim is not None, self.empty_dir)) != 1:
            raise ValueError("name exactly one of host_path (a folder on the node), claim (a PersistentVolumeClaim) "
                             "or empty_dir = true (filled by pull = true)")
        if self.empty_dir and not self.pull:
            raise ValueError("an empty_dir volume starts empty: set pull = true so the init container fills it")
        if self.token_secret is not None and not self.pull:
            raise ValueError("token_secret is the pull's Hub token: set pull = true, or remove it")
        return self


class FleetKubernetes(_Strict):
    namespace: StrictStr | None = Field(None, pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
                                        description="the namespace of every object (omit: kubectl's current one)")
    images: EngineImages = Field(default_factory=dict, description="the image of each engine: power (also the "
                                                                   "init container running `power "
                                                                   "verify`), llama-server, vllm")
    volumes: dict[str, ModelVolume] = Field(
        default_factory=dict, description="the volumes holding the model files, by name"
    )
    pod_monitor: StrictBool = Field(False, description="also render a Prometheus Operator PodMonitor per deployment")
    run_as_user: StrictInt = Field(65532, ge=1, description="the non-root user (and group) the containers run as")
    allow_namespaces: list[Annotated[StrictStr, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]] | None = Field(
        None, description="render a NetworkPolicy per deployment that admits only these namespaces (and the "
                          "deployment's own) to the engine's port; omit: the Service is open to the whole cluster")


class Fleet(_Strict):
    schema_id: Literal["power.fleet/v1"] = _schema_field("fleet")
    name: StrictStr | None = Field(None, pattern=NAME_PATTERN, description="the fleet's name")
    hosts: list[HostSpec] = Field(min_length=1, description="inline host definitions")
    deployments: list[Deployment] = Field(default_factory=list, description="what runs where")
    kubernetes: FleetKubernetes | None = Field(None, description="cluster settings for `power fleet render --target "
                                                                 "kubernetes`: images, model volumes, namespace")


# Documents Power writes itself (plans, locks, evidence, caches): recognised, but not user input to validate here.
GENERATED_KINDS = frozenset({"plan", "fleet-lock", "fleet-review", "evidence", "digest-cache"})

KIND_MODELS: dict[str, type[_Strict]] = {"manifest": Manifest, "profile": Profile, "host": Host, "fleet": Fleet}


def schema_id(kind: str) -> str:
    return f"power.{kind}/{SCHEMA_VERSION}"


def json_schema(kind: str) -> dict:
    """The JSON Schema of a file kind, as committed under power/orchestrator/schemas/ (for taplo / Even Better TOML)."""
    schema = KIND_MODELS[kind].model_json_schema(by_alias=True)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def json_schema_text(kind: str) -> str:
    return json.dumps(json_schema(kind), indent=2, sort_keys=False) + "\n"
