"""The engine: a loaded target (trunk + tokenizer + sampler) that turns a prompt into text and a receipt.

It composes, it does not decode: the loop is `power.runtime.decoder.Decoder`
(rounds of the exactness transaction; plain decoding is the zero-proposal
round), so the autoregressive and speculative paths share one code path. What
lives here is what a run needs around that loop: the settings a plan maps to,
the artifact digest check, the context limit, streaming text out as tokens land,
timings and the receipt.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from power import modes
from power.artifacts.verify import TARGET, Artifact, verified_sha256
from power.orchestrator.plan import Mode, ResolvedPlan, Runtime, Sampling, Speculation, located, planned_artifacts
from power.runtime.decoder import Decoder, Generation
from power.runtime.errors import ContextOverflow, RuntimeInputError
from power.runtime.gguf_weights import GGUFFile
from power.runtime.governor import CostGovernor
from power.runtime.receipt import Receipt
from power.runtime.sampling import Sampler, SamplingParams
from power.runtime.scheduler import SchedulerConfig
from power.runtime.speculators import registry
from power.runtime.speculators.base import Speculator, SpeculatorRequest
from power.runtime.stops import StopText
from power.runtime.tokenizer import Tokenizer
from power.runtime.trunks import load_trunk

DEFAULT_CTX = 2048


@dataclass(frozen=True)
class EngineOptions:
    """How this machine runs a workload: choices a plan leaves to the host (they are not in its digest)."""

    device: str = "auto"  # "auto" (a CUDA device when torch sees one, else the CPU), "cpu", "cuda", "cuda:N"
    dtype: str = "float32"  # the layers' weight dtype (`power.runtime.dtypes.WEIGHT_DTYPES`)
    lm_head_dtype: str | None = None  # None: the same as dtype
    threads: int | None = None  # torch intra-op threads; None keeps torch's default
    governor: bool = True  # the cost governor parks a speculator that loses to plain decoding


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
        """Artifacts where `power.orchestrator.plan.located` finds them (relative to the plan's folder, or in `root`)."""
        artifacts = planned_artifacts(located(plan, plan_path, root))
        return cls(artifacts, plan.mode, plan.speculation, plan.runtime, plan.sampling, plan.digest)

    @classmethod
    def of_gguf(cls, path: Path, ctx: int = DEFAULT_CTX, verify_capacity: int = 1) -> Workload:
        return cls(
            artifacts=(Artifact(TARGET, Path(path), None),),
            mode=Mode(requested=modes.NONE, resolved=modes.NONE, chain=(), reason="a direct run of one GGUF"),
            speculation=Speculation(k=0, s=0, rollback="none"),
            runtime=Runtime(ctx=ctx, batch=1, verify_capacity=verify_capacity, gpu_layers="all", flash_attn=False,
                            cuda_graphs=False, kv_cache_type="f32", draft_kv_cache_type="f32"),
            sampling=Sampling(temperature=0.0, seed=0, verify="match"),
            plan_digest=None,
        )

    @property
    def target(self) -> Artifact:
        return self.artifacts[0]

    def drafter(self, kind: str) -> Path | None:
        return next((a.path for a in self.artifacts[1:] if a.role == kind), None)

    @property
    def sampling_params(self) -> SamplingParams:
        s = self.sampling
        return SamplingParams(temperature=s.temperature, seed=s.seed, verify=s.verify)


class Engine:
    def __init__(self, workload: Workload, options: EngineOptions = EngineOptions()) -> None:
        started = time.perf_counter()
        if options.threads:
            torch.set_num_threads(options.threads)
        self.workload, self.options = workload, options
        self.artifacts = {str(a.path): verified_sha256(a) for a in workload.artifacts}
        self.device = resolve_device(options.device)
        runtime = workload.runtime
        gguf = GGUFFile(workload.target.path)
        self.trunk = load_trunk(gguf, n_ctx=runtime.ctx, verify_capacity=runtime.verify_capacity,
                                snapshot_rows=workload.speculation.s, dtype=options.dtype,
                                lm_head_dtype=options.lm_head_dtype, device=self.device)
        self.tokenizer = Tokenizer.from_gguf(gguf)
        speculator = _speculator(workload, self.trunk)
        self.width = ProposalWidth.of(workload, speculator)
        schedule = SchedulerConfig(k=self.width.effective, s=max(1, workload.speculation.s),
                                   adaptive=workload.speculation.adaptive)
        # One governor per engine: its verdict on this speculator outlives a request.
        governor = CostGovernor() if speculator is not None and options.governor else None
        self.decoder = Decoder(self.trunk, Sampler(workload.sampling_params), speculator, schedule, governor)
        self.load_s = time.perf_counter() - started

    @property
    def n_ctx(self) -> int:
        return self.workload.runtime.ctx

    @property
    def sampling(self) -> SamplingParams:
        """The plan's sampling; a request may override it."""
        return self.workload.sampling_params

    def generate(self, prompt: str, max_tokens: int, on_text: Callable[[str], None] | None = None,
                 cancel: threading.Event | None = None, sampling: SamplingParams | None = None,
                 stop: Sequence[str] = ()) -> Receipt:
        """Generate up to `max_tokens` tokens after `prompt`, calling `on_text` with text as it is decoded.

        Setting `cancel` (from any thread) ends the request at the next step boundary: the open round is
        rolled back to the last committed transaction and the receipt says `cancelled`. `sampling`
        overrides the plan's sampling for this request (a server's per-request temperature and seed).
        A `stop` string ends the request normally after the round that completed it (`power.runtime.stops`):
        the receipt says `stop`, its text ends before the stop string, its tokens with the one that completed it.
        """
        self.decoder.sampler = Sampler(sampling or self.sampling)
        prompt_ids = self.tokenizer.encode(prompt)
        room = self.n_ctx - len(prompt_ids) + 1  # the last emitted token needs no cache slot
        if room < 1 + (max_tokens > 1):
            raise ContextOverflow(f"the prompt is {len(prompt_ids)} tokens; the context is {self.n_ctx} positions",
                                  hint="shorten the prompt or plan a larger ctx")
        text = StopText(self.tokenizer.stream(), stop)
        finish = threading.Event()
        pieces: list[str] = []

        def emit(token_ids: list[int]) -> None:
            piece = text.feed(token_ids)
            pieces.append(piece)
            if on_text and piece:
                on_text(piece)
            if text.hit:
                finish.set()

        generation = self.decoder.generate(prompt_ids, min(max_tokens, room), self.tokenizer.stop_ids, cancel,
                                           finish=finish, on_tokens=emit)
        tail = text.flush()
        if on_text and tail:
            on_text(tail)
        if text.hit:
            generation.tokens, generation.stopped = generation.tokens[: text.tokens], True
        return self._receipt(prompt_ids, generation, "".join(pieces) + tail, max_tokens, room)

    def _receipt(self, prompt_ids: list[int], generation: Generation, text: str, max_tokens: int,
                 room: int) -> Receipt:
        stats = generation.stats
        if generation.cancelled:
            reason = "cancelled"
        elif generation.stopped:
            reason = "stop"
        else:
            reason = "context" if len(generation.tokens) >= room and room < max_tokens else "length"
        options, runtime = self.options, self.workload.runtime
        return Receipt(
            plan_digest=self.workload.plan_digest, artifacts=dict(self.artifacts), mode=self.workload.mode.resolved,
            prompt_tokens=len(prompt_ids), token_ids=list(generation.tokens), text=text, stop_reason=reason,
            rounds=stats.rounds, proposed=stats.proposed, accepted=stats.accepted, replays=stats.replays,
            clamps=stats.clamps, fallbacks=stats.fallbacks, speculative_rounds=stats.speculative_rounds,
            governor_parks=stats.governor_parks,
            load_s=self.load_s, prefill_s=stats.prefill_s, decode_s=stats.decode_s,
            runtime={"device": self.device, "dtype": options.dtype, "lm_head_dtype": self.trunk.options.head_dtype,
                     "threads": torch.get_num_threads(), "n_ctx": runtime.ctx,
                     "verify_capacity": runtime.verify_capacity, "prefill_chunk": self.trunk.options.prefill_chunk,
                     "architecture": self.trunk.config.architecture, "torch": torch.__version__},
            proposal_width=self.width.document(),
        )


@dataclass(frozen=True)
class ProposalWidth:
    """K as the engine runs it: the plan's K, cut once, here, to what the fixed shape and the drafter allow.

    Each round also stops one short of the tokens the request has left (the round's own token is the last).
    """

    planned: int
    effective: int
    limited_by: str | None

    @classmethod
    def of(cls, workload: Workload, speculator: Speculator | None) -> ProposalWidth:
        planned = workload.speculation.k if speculator is not None else 0
        limits = [(workload.runtime.verify_capacity - 1, f"the verification capacity of "
                                                         f"{workload.runtime.verify_capacity} rows (anchor + K)")]
        if speculator is not None and speculator.max_proposals is not None:
            limits.append((speculator.max_proposals, f"the {speculator.name} drafter's block "
                                                     f"({speculator.max_proposals} proposals)"))
        limit, reason = min(limits)
        return cls(planned, min(planned, limit), reason if limit < planned else None)

    def document(self) -> dict[str, object]:
        return {"planned": self.planned, "effective": self.effective, "limited_by": self.limited_by}


def resolve_device(device: str) -> str:
    """"auto" -> "cuda" when torch sees a CUDA device, else "cpu"; an explicit CUDA device must exist (fail closed)."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    cuda = re.fullmatch(r"cuda(?::(\d+))?", device)
    if device != "cpu" and not cuda:
        raise RuntimeInputError(f"device {device!r} is not supported", code="PWR601",
                                hint="choose auto, cpu, cuda or cuda:N")
    if cuda and int(cuda.group(1) or 0) >= torch.cuda.device_count():
        raise RuntimeInputError(f"device {device!r}: this torch ({torch.__version__}) sees "
                                f"{torch.cuda.device_count()} CUDA device(s)", code="PWR601",
                                hint="use a CUDA build of torch on a machine with that GPU, or --device cpu")
    return device


def _speculator(workload: Workload, trunk) -> Speculator | None:
    """The plan's speculator; a decline is an error (fail closed)."""
    kind = workload.mode.resolved
    if kind == modes.NONE:
        return None
    runtime, speculation = workload.runtime, workload.speculation
    orders = (runtime.ngram_n_min, runtime.ngram_n_max) if runtime.ngram_n_min and runtime.ngram_n_max else None
    request = SpeculatorRequest(trunk, target_path=workload.target.path, drafter_path=workload.drafter(kind),
                                fr_vocab_size=speculation.fr_vocab_size, ngram_orders=orders)
    return registry.create(kind, request)
