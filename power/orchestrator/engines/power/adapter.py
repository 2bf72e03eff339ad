"""Power's own runtime: one device, every mode Power has a speculator for, its sizing, `power serve PLAN`.

The runtime reads the plan itself, so its command line is the plan's path; the
settings table names the POWER_* variables the env-file render writes for
supervisors and scripts that read them.
"""

from __future__ import annotations

from pathlib import Path

from power import modes
from power.artifacts.facts import RECURRENT, ArtifactFacts
from power.artifacts.runtime_types import unreadable_types
from power.documents.kv_types import Q8_0_BLOCK, RUNTIME_KV_TYPES, whole_blocks
from power.documents.plan import EngineName, ResolvedPlan
from power.findings import Finding
from power.orchestrator.engines.base import Asked, EngineAdapter, Launch, Refusal, Setting, Settings
from power.orchestrator.engines.common import draft_placement_refusal, tensor_parallel_refusal
from power.orchestrator.engines.power.sizing import size_power
from power.orchestrator.engines.sizing.model import DeviceBudget, Request, Sizing

NAME: EngineName = "power"

SETTINGS = Settings((
    Setting("plan", None, "POWER_PLAN", "the plan file `power serve` runs"),
    Setting("digest", None, "POWER_PLAN_DIGEST", "the plan's digest, which the runtime checks the file against"),
    Setting("name", None, "POWER_NAME", "the deployment's name (the model name /v1/models reports)"),
    Setting("target", None, "POWER_TARGET", "the target GGUF"),
    Setting("target_sha256", None, "POWER_TARGET_SHA256", "the target's sha256"),
    Setting("mode", None, "POWER_SPEC_MODE", "the resolved speculative mode"),
    Setting("chain", None, "POWER_SPEC_CHAIN", "the modes drafted in order, comma-separated"),
    Setting("k", None, "POWER_SPEC_DRAFT_MAX", "K, the proposal width"),
    Setting("s", None, "POWER_SPEC_RECURRENT_SNAPSHOTS", "S, the recurrent state snapshots kept per round"),
    Setting("rollback", None, "POWER_SPEC_ROLLBACK", "how a recurrent target's state rolls back"),
    Setting("ctx", None, "POWER_CTX", "the context in tokens"),
    Setting("verify_capacity", None, "POWER_VERIFY_CAPACITY", "the fixed verification shape, in rows"),
    Setting("arithmetic", None, "POWER_ARITHMETIC", "the arithmetic the runtime computes in"),
    Setting("root", "--root", help="where `power serve` looks for the plan's artifacts"),
    Setting("host", "--host", help="the address the server binds"),
    Setting("port", "--port", help="the port the server binds"),
))


# Where a `power` image holds the CPU kernels it built, read-only like the rest of the image (docs/kubernetes.md).
KERNEL_CACHE_DIR = "/opt/power/kernels"


class PowerRuntime(EngineAdapter):
    name = NAME
    public_metrics_option = "--public-metrics"
    image_prebuilt = ("POWER_KERNEL_CACHE", KERNEL_CACHE_DIR,
                      f"`POWER_KERNEL_CACHE={KERNEL_CACHE_DIR} power kernels build --all && chmod -R a+rX,go-w "
                      f"{KERNEL_CACHE_DIR}` when the image is built (the CPU kernels, so no pod compiles them)")
    description = "Power's runtime"
    checks_host_memory = True
    settings = SETTINGS
    targets = ("power", "env", "systemd")
    env_target = "env"

    def supports(self, asked: Asked) -> list[Refusal]:
        refusals = []
        for kind in asked.chain:
            if modes.mode(kind).speculator is None:
                document, where = asked.drafter_where(kind)
                refusals.append(Refusal("PWR460", f"Power's runtime has no speculator for {kind}",
                                        "choose a mode Power's runtime runs", document, where))
        if asked.devices > 1:
            refusals.append(Refusal("PWR510", f"Power's runtime runs on one device; this deployment names "
                                    f"{asked.devices}", 'run it with engine "llama-server" (a layer split) or "vllm" '
                                    "(tensor parallelism), or use one device", "profile", "runtime"))
        if asked.kv_unified:
            refusals.append(Refusal("PWR510", "Power's runtime gives each slot its own region of ctx / slots "
                                    "positions; runtime.kv_unified shares one cache between them",
                                    'set kv_unified = false, or run engine "llama-server"', "profile",
                                    "runtime.kv_unified"))
        for key, kv_type in (("kv_cache_type", asked.kv_cache_type), ("draft_kv_cache_type",
                                                                      asked.draft_kv_cache_type)):
            if kv_type is not None and kv_type not in RUNTIME_KV_TYPES:
                refusals.append(Refusal("PWR512", f"{key} = \"{kv_type}\" is not a type Power's runtime holds its "
                                        f"caches in ({', '.join(RUNTIME_KV_TYPES)})",
                                        f"set {key} to one of {', '.join(RUNTIME_KV_TYPES)}", "profile",
                                        f"runtime.{key}"))
        return (refusals + asked.checkpoint_refusals("Power's runtime") + tensor_parallel_refusal(self.name, asked)
                + draft_placement_refusal(self.name, asked, kv_types=False))

    def target_refusals(self, target: ArtifactFacts, asked: Asked) -> list[Refusal]:
        """CUDA graphs asked of a target with recurrent layers, which the runtime refuses to capture at load on a CUDA
        device (PWR607, `power.runtime.trunks.base.Trunk.capture_graphs`): a warning (PWR651), since the plan still
        runs on the CPU, where graphs do not apply; a q8_0 cache, which stores whole blocks of 32 values of each
        head's key and value rows."""
        refusals = []
        if asked.graphs_on_gpu and any(layer.kind == RECURRENT for layer in target.layers):
            refusals.append(Refusal("PWR651", f"runtime.cuda_graphs = true, but Power's runtime cannot capture the "
                                    f"{target.architecture} target in CUDA graphs (its recurrent layers run each "
                                    "sequence's rows through their state in Python): a run on a CUDA device is "
                                    "refused at load (PWR607)",
                                    "set cuda_graphs = false in the profile's [runtime] to run it on Power's runtime, "
                                    'or keep the graphs and run engine "llama-server", which captures this target',
                                    "profile", "runtime.cuda_graphs"))
        widths = sorted({w for layer in target.layers if layer.kind != RECURRENT
                         for w in (layer.head_dim_k, layer.head_dim_v) if w})
        if all(whole_blocks(asked.kv_cache_type, width) for width in widths):
            return refusals
        return refusals + [Refusal("PWR513", f"kv_cache_type = \"{asked.kv_cache_type}\" stores blocks of "
                        f"{Q8_0_BLOCK} values; the target's key/value head widths {'/'.join(map(str, widths))} "
                        "are not whole blocks",
                        'set kv_cache_type = "f16" (or "bf16", "f32")', "profile", "runtime.kv_cache_type")]

    def artifact_findings(self, artifact: ArtifactFacts) -> list[Finding]:
        """A tensor of a type the runtime's loader cannot dequantise (PWR122), refused before a plan is sealed."""
        return unreadable_types(artifact.path, artifact.tensors)

    def size(self, target: ArtifactFacts, drafter: ArtifactFacts | None, request: Request,
             devices: tuple[DeviceBudget, ...]) -> Sizing:
        return size_power(target, drafter, request, devices)

    def launch(self, plan: ResolvedPlan, plan_path: Path, root: Path | None = None) -> Launch:  # noqa: ARG002
        words = ((SETTINGS.flag("root"), str(Path(root).resolve())),) if root is not None else ()
        return Launch(("power", "serve", str(plan_path)), words, {}, ())

    def host_memory_bytes(self, plan: ResolvedPlan) -> int:
        """The plan's own sizing: the runtime reads each file into memory it owns and builds its weights, caches and
        buffers beside it; on a CPU that is host memory, and while loading on a GPU the host stages it."""
        return plan.memory.total_bytes

    def variables(self, plan: ResolvedPlan, plan_path: Path) -> dict[str, object]:
        """The POWER_* variables of the env file."""
        spec = plan.speculation
        values: dict[str, object] = {
            "plan": str(plan_path), "digest": plan.digest, "name": plan.name, "target": plan.target.path,
            "target_sha256": plan.target.sha256, "mode": plan.mode.resolved, "chain": ",".join(plan.mode.chain),
            "k": spec.k, "s": spec.s, "rollback": spec.rollback, "ctx": plan.runtime.ctx,
            "verify_capacity": plan.runtime.verify_capacity, "arithmetic": plan.runtime.arithmetic,
        }
        return {str(SETTINGS.env(field)): value for field, value in values.items()}
