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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import torch

from power.orchestrator import digests, gguf_reader
from power.runtime.decoder import Decoder, Generation
from power.runtime.governor import CostGovernor
from power.runtime.governor import shared as shared_governor
from power.runtime.errors import ArtifactError, ContextOverflow, RuntimeInputError
from power.runtime.gguf_weights import GGUFFile
from power.runtime.receipt import Receipt
from power.runtime.sampling import Sampler, SamplingParams
from power.runtime.scheduler import SchedulerConfig
from power.runtime.speculators import registry
from power.runtime.speculators.base import Speculator
from power.runtime.speculators.registry import SpeculatorRequest
from power.runtime.stops import StopText
from power.runtime.tokenizer import Tokenizer
from power.runtime.trunks import load_trunk

DEFAULT_CTX = 2048


@dataclass(frozen=True)
class EngineSettings:
    """What the runtime needs to load a target and generate; a plan maps into it in `from_plan`."""

    target_path: Path
    n_ctx: int = DEFAULT_CTX
    verify_capacity: int = 1
    snapshot_rows: int = 0
    dtype: str = "float32"  # the layers' weight dtype (`power.runtime.dtypes.WEIGHT_DTYPES`)
    lm_head_dtype: str | None = None  # None: the same as dtype
    device: str = "auto"  # the target's device: "auto" (a CUDA device when torch sees one, else the CPU), "cpu", "cuda"
    threads: int | None = None  # torch intra-op threads; None keeps torch's default
    sampling: SamplingParams = SamplingParams()
    mode: str = "none"
    plan_digest: str | None = None
    target_sha256: str | None = None  # the digest the plan promises; checked before loading
    k: int = 0  # spec_draft_max
    adaptive: bool = False  # spec_mtp_adaptive
    drafter_paths: dict[str, Path] = field(default_factory=dict)  # drafter kind -> artifact
    fr_vocab_size: int | None = None
    ngram_orders: tuple[int, int] | None = None  # (min, max) n-gram order
    governor: bool = True  # the cost governor parks a speculator that loses to plain decoding

    @classmethod
    def from_plan(cls, plan, plan_path: Path, **overrides) -> EngineSettings:
        """The one mapping from a `ResolvedPlan` to the runtime (target path relative to the plan's folder)."""
        rs = plan.runtime_settings()
        target = _relative_to(plan_path, rs.target_path)
        settings = cls(
            target_path=target, n_ctx=rs.ctx, verify_capacity=rs.verify_capacity, snapshot_rows=rs.s,
            sampling=SamplingParams(temperature=rs.temperature, seed=rs.seed, verify=rs.verify),
            mode=rs.mode, plan_digest=rs.plan_digest, target_sha256=plan.target.sha256,
            k=rs.k, adaptive=rs.adaptive, fr_vocab_size=rs.fr_vocab_size,
            drafter_paths={kind: _relative_to(plan_path, path) for kind, path in rs.drafter_paths.items()},
            ngram_orders=(rs.ngram_n_min, rs.ngram_n_max) if rs.ngram_n_min and rs.ngram_n_max else None,
        )
        return replace(settings, **overrides)


class Engine:
    def __init__(self, settings: EngineSettings) -> None:
        started = time.perf_counter()
        if settings.threads:
            torch.set_num_threads(settings.threads)
        self.settings = settings
        self.target_sha256 = _verified_sha256(settings.target_path, settings.target_sha256)
        self.device = resolve_device(settings.device)
        gguf = GGUFFile(settings.target_path)
        self.trunk = load_trunk(gguf, n_ctx=settings.n_ctx, verify_capacity=settings.verify_capacity,
                                snapshot_rows=settings.snapshot_rows, dtype=settings.dtype,
                                lm_head_dtype=settings.lm_head_dtype, device=self.device)
        self.tokenizer = Tokenizer.from_gguf(gguf)
        self.decoder = _StreamingDecoder(self.trunk, Sampler(settings.sampling), *_speculation(settings, self.trunk))
        self.load_s = time.perf_counter() - started

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
        self.decoder.sampler = Sampler(sampling or self.settings.sampling)
        prompt_ids = self.tokenizer.encode(prompt)
        room = self.settings.n_ctx - len(prompt_ids) + 1  # the last emitted token needs no cache slot
        if room < 1 + (max_tokens > 1):
            raise ContextOverflow(f"the prompt is {len(prompt_ids)} tokens; the context is {self.settings.n_ctx} "
                                  "positions: shorten the prompt or plan a larger ctx")
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

        generation = self.decoder.generate_streaming(prompt_ids, min(max_tokens, room), self.tokenizer.stop_ids, emit,
                                                     cancel, finish)
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
        s = self.settings
        return Receipt(
            plan_digest=s.plan_digest, artifacts={str(s.target_path): self.target_sha256}, mode=s.mode,
            prompt_tokens=len(prompt_ids), token_ids=list(generation.tokens), text=text, stop_reason=reason,
            rounds=stats.rounds, proposed=stats.proposed, accepted=stats.accepted, replays=stats.replays,
            clamps=stats.clamps, fallbacks=stats.fallbacks, speculative_rounds=stats.speculative_rounds,
            governor_parks=stats.governor_parks,
            load_s=self.load_s, prefill_s=stats.prefill_s, decode_s=stats.decode_s,
            runtime={"device": self.device, "dtype": s.dtype, "lm_head_dtype": self.trunk.options.head_dtype, "threads": torch.get_num_threads(), "n_ctx": s.n_ctx,
                     "verify_capacity": s.verify_capacity, "prefill_chunk": self.trunk.options.prefill_chunk,
                     "architecture": self.trunk.config.architecture, "torch": torch.__version__},
        )


class _StreamingDecoder(Decoder):
    """The decode loop with a callback for each round's emitted tokens."""

    def generate_streaming(self, prompt: list[int], max_new_tokens: int, stop_ids, on_tokens,
                           cancel: threading.Event | None = None, finish: threading.Event | None = None) -> Generation:
        self._on_tokens, self._streamed = on_tokens, 0
        generation = self.generate(prompt, max_new_tokens, stop_ids, cancel, finish=finish)
        self._flush(generation.tokens)
        return generation

    def _round(self, seq, scheduler, stats, remaining) -> None:
        self._flush(seq.emitted)  # the first token, drawn by the prefill
        super()._round(seq, scheduler, stats, remaining)
        self._flush(seq.emitted)

    def _flush(self, emitted: list[int]) -> None:
        if len(emitted) > self._streamed:
            self._on_tokens(emitted[self._streamed:])
            self._streamed = len(emitted)


def resolve_device(device: str) -> str:
    """"auto" -> "cuda" when torch sees a CUDA device, else "cpu"; an explicit CUDA device must exist (fail closed)."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    cuda = re.fullmatch(r"cuda(?::(\d+))?", device)
    if device != "cpu" and not cuda:
        raise RuntimeInputError(f"device {device!r} is not supported; choose auto, cpu, cuda or cuda:N")
    if cuda and int(cuda.group(1) or 0) >= torch.cuda.device_count():
        raise RuntimeInputError(f"device {device!r}: this torch ({torch.__version__}) sees {torch.cuda.device_count()} "
                                "CUDA device(s); use a CUDA build of torch on a machine with that GPU, or --device cpu")
    return device


def _relative_to(plan_path: Path, path: str) -> Path:
    return Path(path) if Path(path).is_absolute() else Path(plan_path).parent / path


def _speculation(settings: EngineSettings, trunk) -> tuple[Speculator | None, SchedulerConfig, CostGovernor | None]:
    """The plan's speculator (fail closed: a decline is an error), its K/S schedule and the shared governor."""
    schedule = SchedulerConfig(k=settings.k, s=max(1, settings.snapshot_rows), adaptive=settings.adaptive)
    if settings.mode == "none":
        return None, schedule, None
    options = {"fr_vocab": settings.fr_vocab_size}
    if settings.ngram_orders:
        options |= {"ngram_min": settings.ngram_orders[0], "ngram_max": settings.ngram_orders[1]}
    request = SpeculatorRequest(trunk, settings.k, drafter_path=settings.drafter_paths.get(settings.mode),
                                target_path=settings.target_path, options=options)
    speculator = registry.create(settings.mode, request)
    governor = shared_governor(str(settings.target_path), settings.mode) if settings.governor else None
    return speculator, schedule, governor


def _verified_sha256(path: Path, expected: str | None) -> str:
    """The artifact's sha256 (cached by the orchestrator); a mismatch with the plan's digest is an error."""
    if not Path(path).is_file():
        raise ArtifactError(f"{path}: the target artifact does not exist; fix the manifest's target.path and re-plan")
    try:
        actual = digests.sha256_file(path)
    except gguf_reader.ArtifactError as err:
        raise ArtifactError(str(err)) from None
    if expected is not None and actual != expected:
        raise ArtifactError(f"{path}: sha256 is {actual[:16]}..., the plan expects {expected[:16]}...; "
                            "the artifact changed after planning: re-plan, or restore the planned file")
    return actual
