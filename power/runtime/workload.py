"""What the engine runs (`Workload`): a plan's own sections and where its artifacts lie, read without torch, so a
command refuses a plan whose artifacts are missing before the runtime's stack loads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from power import modes
from power.artifacts.verify import TARGET, Artifact
from power.documents import kv_types
from power.documents.arithmetic import AUTO
from power.documents.arithmetic import resolve as resolve_arithmetic
from power.documents.plan import Mode, ResolvedPlan, Runtime, Sampling, Speculation, located, planned_artifacts

DEFAULT_CTX = 2048


@dataclass(frozen=True)
class Workload:
    """What the engine runs: the plan's own sections, read as they are, and where its artifacts lie.

    `of_plan` takes a resolved plan; `of_gguf` is a plan-less, target-only run of one GGUF.
    """

    artifacts: tuple[Artifact, ...]  # the target first, then the drafters with files
    mode: Mode
    speculation: Speculation
    runtime: Runtime
    sampling: Sampling
    plan_digest: str | None

    @classmethod
    def of_plan(cls, plan: ResolvedPlan, plan_path: Path, root: Path | None = None) -> Workload:
        """Artifacts where `power.documents.plan.located` finds them (relative to the plan's folder, or in `root`)."""
        artifacts = planned_artifacts(located(plan, plan_path, root))
        return cls(artifacts, plan.mode, plan.speculation, plan.runtime, plan.sampling, plan.digest)

    @classmethod
    def of_gguf(cls, path: Path, ctx: int = DEFAULT_CTX, verify_capacity: int = 1) -> Workload:
        """The arithmetic and the KV cache type are a plan's defaults (`auto`, f16), so a plan-less run gives a
        default plan's tokens."""
        return cls(
            artifacts=(Artifact(TARGET, Path(path), None),),
            mode=Mode(requested=modes.NONE, resolved=modes.NONE, chain=(), reason="a direct run of one GGUF"),
            speculation=Speculation(k=0, s=0, rollback="none"),
            runtime=Runtime(ctx=ctx, batch=1, verify_capacity=verify_capacity, gpu_layers="all", flash_attn=False,
                            cuda_graphs=False, kv_cache_type=kv_types.DEFAULT, draft_kv_cache_type=kv_types.DEFAULT,
                            arithmetic=resolve_arithmetic(AUTO)),
            sampling=Sampling(temperature=0.0, seed=0, verify="match"),
            plan_digest=None,
        )

    @property
    def target(self) -> Artifact:
        return self.artifacts[0]

    def drafter(self, kind: str) -> Path | None:
        return next((a.path for a in self.artifacts[1:] if a.role == kind), None)
