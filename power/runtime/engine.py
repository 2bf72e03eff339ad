"""The engine: a loaded target (trunk + tokenizer + sampler) that turns prompts into text and receipts.

It composes, it does not decode: the loop is `power.runtime.decoder.Decoder`
(rounds of the exactness transaction; plain decoding is the zero-proposal
round), so the autoregressive and speculative paths share one code path. What
lives here is what a run needs around that loop: the settings a plan maps to,
the artifact digest check, the context limit, streaming text out as tokens land,
stop strings, timings and the receipt.

The plan's `runtime.slots` is how many requests decode side by side, each in its
own slot of ctx / slots positions (llama-server's split without a unified KV
cache). `submit` queues a request and `step` advances every request in flight by
one round (a server's engine thread calls it in a loop); `generate` runs one
request to its end.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from power import __version__, modes, threads
from power.documents.geometry import runtime_geometry
from power.documents.plan import Runtime
from power.documents.receipt import Receipt
from power.kernels.cpu.cache import KernelError
from power.kernels.cpu.waits import kernel_wait
from power.runtime import heap
from power.runtime.decoder import Decoder, DecodeRequest, Decoding, Generation
from power.runtime.devices import NO_CUDA_HINT, cuda_index
from power.runtime.errors import ContextOverflow, RuntimeInputError, kernel_refusal
from power.runtime.gguf_weights import GGUFFile
from power.runtime.governor import GovernorConfig
from power.runtime.host_memory import require_room
from power.runtime.sampling import Sampler, SamplingParams
from power.runtime.scheduler import SchedulerConfig
from power.runtime.speculators import registry
from power.runtime.speculators.base import NGramWindow, Speculator, SpeculatorRequest
from power.runtime.speculators.chain import ChainSpeculator
from power.runtime.stops import StopText
from power.runtime.tokenizer import Tokenizer
from power.runtime.transaction import StepObserver
from power.runtime.trunks import load_trunk
from power.runtime.workload import Workload


@dataclass(frozen=True)
class EngineOptions:
    """How this machine runs a workload: choices a plan leaves to the host (they are not in its digest, and none
    changes a token: the arithmetic is the plan's)."""

    device: str = "auto"  # "auto" (a CUDA device when torch sees one, else the CPU), "cpu", "cuda", "cuda:N"
    threads: int | None = None  # torch intra-op threads; None: this process's CPUs (power.threads.thread_budget)
    governor: bool = True  # the cost governor parks a speculator that loses to plain decoding
    # greedy rows' tokens from the exact greedy LM head where its rule allows (power.documents.greedy_head); off: the
    # operator's escape hatch, the full head for every row (the same tokens)
    greedy_head: bool = True


@dataclass(eq=False)
class Ticket:
    """One request in the engine: its text as it goes out, and its receipt (or error) once it has ended."""

    prompt_ids: list[int]
    max_tokens: int
    room: int  # tokens the context leaves the request
    text: StopText
    on_text: Callable[[str], None] | None
    on_done: Callable[[Ticket], None] | None
    finish: threading.Event = field(default_factory=threading.Event)
    pieces: list[str] = field(default_factory=list)
    receipt: Receipt | None = None
    error: Exception | None = None

    @property
    def done(self) -> bool:
        return self.receipt is not None or self.error is not None

    def result(self) -> Receipt:
        """The receipt of a request that has ended; its error raised if it failed."""
        if self.error is not None:
            raise self.error
        if self.receipt is None:
            raise RuntimeError("the request has not ended yet")
        return self.receipt

    def emit(self, token_ids: list[int]) -> None:
        piece = self.text.feed(token_ids)
        self.pieces.append(piece)
        if self.on_text and piece:
            self.on_text(piece)
        if self.text.hit:
            self.finish.set()


class Engine:
    def __init__(self, workload: Workload, options: EngineOptions = EngineOptions()) -> None:
        started = time.perf_counter()
        self.threads_why = _set_threads(options.threads)
        try:
            self.kernel_wait = kernel_wait()
        except KernelError as error:  # PWR652, before the load: the environment names no wait
            raise kernel_refusal(error) from error
        self.workload, self.options = workload, options
        runtime = workload.runtime
        self.slots = _slots(runtime)
        self.device = resolve_device(options.device)
        if torch.device(self.device).type == "cpu":
            require_room(workload.artifacts)  # before a byte of tensor data is read (PWR650, PWR520)
        # Each artifact is hashed once, in full, against the plan; each tensor's bytes are checked against that read
        # as they are copied into place, so the engine runs the bytes verified.
        gguf = GGUFFile.verified(workload.target)
        drafters = {a.role: GGUFFile.verified(a) for a in workload.artifacts[1:]}
        self.artifacts = {str(file.path): file.sha256 for file in (gguf, *drafters.values())}
        try:
            self.trunk = load_trunk(gguf, n_ctx=runtime_geometry(runtime.ctx, self.slots,
                                                                 runtime.verify_capacity).positions_per_slot,
                                    verify_capacity=runtime.verify_capacity,
                                    snapshot_rows=workload.speculation.s, arithmetic=runtime.arithmetic,
                                    device=self.device, slots=self.slots, kv_type=runtime.kv_cache_type,
                                    greedy_head=options.greedy_head)
        except KernelError as error:  # the CPU kernels: a path, a build or the cache (docs/kernels.md)
            raise kernel_refusal(error) from error
        if runtime.cuda_graphs and torch.device(self.device).type == "cuda":
            self.trunk.capture_graphs()  # refused (PWR607) where the trunk's forward cannot be captured
        self.tokenizer = Tokenizer.from_gguf(gguf)
        self.chat_template = gguf.get("tokenizer.chat_template")  # the model's own (None: it carries none)
        speculator = _speculator(workload, self.trunk, gguf, drafters)
        for file in (gguf, *drafters.values()):
            file.release()  # everything is built: the file is closed, the header's long arrays dropped
        heap.trim()  # the load's temporaries, freed, go back to the system
        self.width = ProposalWidth.of(workload, speculator)
        schedule = SchedulerConfig(k=self.width.effective, s=max(1, workload.speculation.s),
                                   adaptive=workload.speculation.adaptive)
        # One governor per slot: its verdict on the speculator outlives a request.
        governor = GovernorConfig() if speculator is not None and options.governor else None
        self.decoder = Decoder(self.trunk, Sampler(sampling_params(workload)), speculator, schedule, governor)
        self.load_s = time.perf_counter() - started

    def identity(self) -> dict[str, Any]:
        """Which engine and build produced a measurement (evidence records it; a rollout compares it)."""
        return {"name": "power", "build": __version__, "torch": torch.__version__, "device": self.device,
                "arithmetic": self.trunk.options.arithmetic, "instruction_path": self.trunk.instruction_path,
                "threads": torch.get_num_threads(), "governor": "on" if self.options.governor else "off"}

    @property
    def n_ctx(self) -> int:
        """The positions one request may use: the plan's ctx split between its slots."""
        return self.trunk.config.n_ctx

    @property
    def sampling(self) -> SamplingParams:
        """The plan's sampling; a request may override it."""
        return sampling_params(self.workload)

    @property
    def busy(self) -> bool:
        """Requests are in flight or waiting for a slot."""
        return self.decoder.busy

    @property
    def free_slots(self) -> int:
        return self.decoder.free_slots

    def encode(self, prompt: str, max_tokens: int, add_bos: bool | None = None,
               deadline: float | None = None) -> list[int]:
        """The prompt's token IDs; ContextOverflow when it leaves no room for `max_tokens` in a slot's context
        (said before tokenizing when its length in bytes alone proves it). `add_bos`: None as the model says;
        `deadline`: the request's (`Tokenizer.encode`)."""
        try:
            size = self.tokenizer.text_bytes(prompt)
        except UnicodeEncodeError as err:
            raise RuntimeInputError(f"the prompt is not valid Unicode: {err.reason} at character {err.start}",
                                    hint="send UTF-8 text (a lone surrogate such as \\ud800 is not text)") from None
        if size > self.n_ctx * self.tokenizer.max_token_bytes:
            raise ContextOverflow(f"the prompt is {size} bytes: more tokens than the context of {self.n_ctx} positions "
                                  f"holds (a token covers at most {self.tokenizer.max_token_bytes} bytes)",
                                  hint="shorten the prompt")
        prompt_ids = self.tokenizer.encode(prompt, add_bos, deadline)
        if not prompt_ids:
            raise RuntimeInputError("the prompt is empty: it has no tokens to continue from (this model adds no BOS "
                                    "token)", hint="send a prompt, or chat messages whose rendered text is not empty")
        self._room(prompt_ids, max_tokens)
        return prompt_ids

    def generate(self, prompt: str, max_tokens: int, on_text: Callable[[str], None] | None = None,
                 cancel: threading.Event | None = None, sampling: SamplingParams | None = None,
                 stop: Sequence[str] = ()) -> Receipt:
        """Generate up to `max_tokens` tokens after `prompt`, calling `on_text` with text as it is decoded
        (`submit` says what the arguments do); steps any other request in flight too."""
        ticket = self.submit(self.encode(prompt, max_tokens), max_tokens, on_text, cancel, sampling, stop)
        while not ticket.done:
            self.step()
        return ticket.result()

    def submit(self, prompt_ids: list[int], max_tokens: int, on_text: Callable[[str], None] | None = None,
               cancel: threading.Event | None = None, sampling: SamplingParams | None = None,
               stop: Sequence[str] = (), on_done: Callable[[Ticket], None] | None = None,
               observer: StepObserver | None = None) -> Ticket:
        """Queue a request; `step` decodes it beside the others, calling `on_text` with text as it is decoded and
        `on_done` with the ticket once its receipt (or error) is in.

        Setting `cancel` (from any thread) ends the request at the next round boundary: its open round is
        rolled back to the last committed transaction and the receipt says `cancelled`. `sampling` overrides
        the plan's sampling for this request (a server's per-request temperature and seed). A `stop` string
        ends the request normally after the round that completed it (`power.runtime.stops`): the receipt says
        `stop`, its text ends before the stop string, its tokens with the one that completed it. `observer`
        sees every step of the request's transactions (`power.runtime.transaction`; fault injection).
        """
        room = self._room(prompt_ids, max_tokens)
        ticket = Ticket(list(prompt_ids), max_tokens, room, StopText(self.tokenizer.stream(), stop), on_text, on_done)
        request = DecodeRequest(ticket.prompt_ids, min(max_tokens, room), Sampler(sampling or self.sampling),
                                self.tokenizer.stop_ids, cancel, observer, ticket.finish, ticket.emit,
                                on_done=lambda decoding: self._ended(ticket, decoding))
        self.decoder.submit(request)
        return ticket

    def step(self) -> None:
        """One round for every request in flight (admitting waiting ones into free slots first)."""
        self.decoder.step()

    def _room(self, prompt_ids: list[int], max_tokens: int) -> int:
        return context_room(len(prompt_ids), max_tokens, self.workload.runtime)

    def _ended(self, ticket: Ticket, decoding: Decoding) -> None:
        if decoding.error is not None:
            ticket.error = decoding.error
        else:
            generation = decoding.result()
            tail = ticket.text.flush()
            if ticket.on_text and tail:
                ticket.on_text(tail)
            if ticket.text.hit:
                generation.tokens, generation.stopped = generation.tokens[: ticket.text.tokens], True
            ticket.receipt = self._receipt(ticket, generation, "".join(ticket.pieces) + tail)
        if ticket.on_done:
            ticket.on_done(ticket)

    def _receipt(self, ticket: Ticket, generation: Generation, text: str) -> Receipt:
        stats = generation.stats
        if generation.cancelled:
            reason = "cancelled"
        elif generation.stopped:
            reason = "stop"
        else:
            room = ticket.room
            reason = "context" if len(generation.tokens) >= room and room < ticket.max_tokens else "length"
        runtime, arithmetic, graphs = self.workload.runtime, self.trunk.options.arithmetic, self.trunk.graphs
        return Receipt(
            plan_digest=self.workload.plan_digest, artifacts=dict(self.artifacts), mode=self.workload.mode.resolved,
            prompt_tokens=len(ticket.prompt_ids), token_ids=list(generation.tokens), text=text, stop_reason=reason,
            rounds=stats.rounds, proposed=stats.proposed, accepted=stats.accepted, replays=stats.replays,
            clamps=stats.clamps, fallbacks=stats.fallbacks, speculative_rounds=stats.speculative_rounds,
            governor_parks=stats.governor_parks, plain_tok_s=stats.plain_tok_s,
            position_reached=list(stats.position_reached),
            position_accepted=list(stats.position_accepted), load_s=self.load_s, prefill_s=stats.prefill_s,
            decode_s=stats.decode_s,
            runtime={"device": self.device, "arithmetic": arithmetic, "instruction_path": self.trunk.instruction_path,
                     "real_rows": self.trunk.real_rows, "weight_bytes": self.trunk.weight_bytes,
                     # the element type the attention caches hold their rows in (the plan's kv_cache_type)
                     "kv_cache_type": self.trunk.options.kv_type,
                     # which LM head chose greedy rows' tokens, and why (docs/runtime.md "The exact greedy LM head")
                     "lm_head": self.trunk.head_path,
                     # the plan's cuda_graphs, and what ran: the decode forwards as CUDA graph replays (on a CUDA
                     # device only; prefill chunks run eagerly), and the row counts captured so far (docs/runtime.md)
                     "cuda_graphs_planned": runtime.cuda_graphs, "cuda_graphs": graphs is not None,
                     "cuda_graph_rows": graphs.captured if graphs is not None else [],
                     # older readers' names for the weights' arithmetic (receipt fields are never removed)
                     "dtype": arithmetic, "lm_head_dtype": arithmetic, "threads": torch.get_num_threads(),
                     # why that many (the affinity's CPUs, the cgroup quota, or --threads) and how idle
                     # kernel threads wait (power.threads)
                     "threads_why": self.threads_why, "wait_policy": threads.settle_wait_policy().describe(),
                     "kernel_wait": self.kernel_wait.describe(),
                     "n_ctx": runtime.ctx, "slots": self.slots,
                     "slot_ctx": self.n_ctx, "verify_capacity": runtime.verify_capacity,
                     "prefill_chunk": self.trunk.options.prefill_chunk,
                     "architecture": self.trunk.config.architecture, "torch": torch.__version__},
            proposal_width=self.width.document(),
            prompt_reused=generation.reused,
        )


def _set_threads(asked: int | None) -> str:
    """Set torch's intra-op threads: `asked`, else what this process may run on; say why."""
    if asked:
        torch.set_num_threads(asked)
        return f"--threads {asked}"
    budget = threads.thread_budget()
    torch.set_num_threads(budget.threads)
    return budget.describe()


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


def context_room(prompt_tokens: int, max_tokens: int, runtime: Runtime) -> int:
    """The tokens a slot's context leaves a prompt of `prompt_tokens` under `runtime`; ContextOverflow when it leaves
    none for `max_tokens` (asked by the engine per request, and by `power bench` of its traffic before loading)."""
    slots = _slots(runtime)
    n_ctx = runtime_geometry(runtime.ctx, slots, runtime.verify_capacity).positions_per_slot
    room = n_ctx - prompt_tokens + 1  # the last emitted token needs no cache slot
    if room < 1 + (max_tokens > 1):
        per_slot = f" (the plan's {runtime.ctx} split between {slots} slots)" if slots > 1 else ""
        raise ContextOverflow(f"the prompt is {prompt_tokens} tokens; the context is {n_ctx} positions{per_slot}",
                              hint="shorten the prompt or plan a larger ctx")
    return room


def resolve_device(device: str) -> str:
    """"auto" -> "cuda" when torch sees a CUDA device, else "cpu"; an explicit CUDA device must exist (fail closed)."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    index = cuda_index(device)
    if index is not None and index >= torch.cuda.device_count():
        raise RuntimeInputError(f"device {device!r}: this torch ({torch.__version__}) sees "
                                f"{torch.cuda.device_count()} CUDA device(s)", code="PWR601", hint=NO_CUDA_HINT)
    return device


def _slots(runtime: Runtime) -> int:
    """The plan's slots, each with a region of ctx / slots positions; a unified KV cache is refused (fail closed)."""
    if runtime.kv_unified:
        raise RuntimeInputError(f"the plan shares one KV cache between its {runtime.slots} slots (runtime.kv_unified); "
                                f"the Power runtime gives each slot its own region of ctx / slots positions",
                                code="PWR600", hint="set kv_unified = false in the profile's [runtime] and re-plan, or "
                                                    "render the plan for llama-server, which implements it")
    if runtime.ctx // runtime.slots < 2:
        raise RuntimeInputError(f"ctx {runtime.ctx} split between {runtime.slots} slots leaves "
                                f"{runtime.ctx // runtime.slots} positions a slot", code="PWR600",
                                hint="plan a larger ctx or fewer slots")
    return runtime.slots


def _speculator(workload: Workload, trunk, target: GGUFFile, drafters: dict[str, GGUFFile]) -> Speculator | None:
    """The plan's speculator, built from the verified target and drafter files: its chain in order when it chains
    several (`power.runtime.speculators.chain`); a decline is an error (fail closed)."""
    mode = workload.mode
    if mode.resolved == modes.NONE:
        return None
    runtime, speculation = workload.runtime, workload.speculation
    window = (NGramWindow(runtime.ngram_match, runtime.ngram_draft_min, runtime.ngram_draft_max)
              if runtime.ngram_match and runtime.ngram_draft_min and runtime.ngram_draft_max else None)
    members = [registry.create(kind, SpeculatorRequest(trunk, target=target, drafter=drafters.get(kind),
                                                       fr_vocab_size=speculation.fr_vocab_size, ngram=window,
                                                       p_min=speculation.p_min, kv_type=runtime.draft_kv_cache_type))
               for kind in (mode.chain or (mode.resolved,))]
    return members[0] if len(members) == 1 else ChainSpeculator(members)


def sampling_params(workload: Workload) -> SamplingParams:
    """The plan's sampling section as the sampler takes it."""
    s = workload.sampling
    return SamplingParams(temperature=s.temperature, seed=s.seed, verify=s.verify)
