"""A served engine's completions as receipts: `power bench --engine llama-server|vllm` measures it like Power's own.

`ServedEngine` wraps a live server launched from a plan's render
(`power.app.live.LiveEngine`, read by duck typing: the runtime imports
nothing of the orchestrator but the plan) and answers the harness's engine
interface (`power.app.bench.harness.BenchEngine`). Each receipt is built from the
engine's own accounting: llama-server's `timings` (prompt and decode time,
`draft_n`, `draft_n_accepted`) and its `/metrics` deltas around the request
(`spec_decode_num_drafts_total`: the verification steps, the rounds that
proposed; `n_decode_total`: decode calls, of which the prompt's micro-batches
are not rounds); vLLM's `/metrics` spec-decode counters and the request's wall
time. Decode tok/s is then computed as for Power's runtime: the tokens after
the first over the engine's decode time. The raw timings and counters travel in
`receipt.runtime`.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from power.app.live import protocol
from power.documents.plan import ResolvedPlan
from power.documents.receipt import Receipt
from power.runtime.sampling import SamplingParams

# llama-server's stop_type -> the receipt's stop reason.
STOP_REASONS = {"limit": "length", "eos": "stop", "word": "stop"}


class Completion(Protocol):
    @property
    def engine(self) -> str: ...

    @property
    def body(self) -> dict[str, Any]: ...

    @property
    def counters(self) -> dict[str, float]: ...

    @property
    def wall_s(self) -> float: ...


class Server(Protocol):
    plan: ResolvedPlan
    artifacts: dict[str, str]
    load_s: float

    def identity(self) -> dict[str, Any]: ...

    def complete(self, prompt: str, max_tokens: int, temperature: float, seed: int) -> Completion: ...


class ServedEngine:
    """The bench's engine interface over a live server."""

    def __init__(self, server: Server) -> None:
        self.server = server

    @property
    def artifacts(self) -> dict[str, str]:
        return dict(self.server.artifacts)

    @property
    def sampling(self) -> SamplingParams:
        s = self.server.plan.sampling
        return SamplingParams(temperature=s.temperature, seed=s.seed, verify=s.verify)

    def identity(self) -> dict[str, Any]:
        return self.server.identity()

    def generate(self, prompt: str, max_tokens: int, *, sampling: SamplingParams | None = None) -> Receipt:
        """One completion of `prompt`, measured by the engine's own timings and counters."""
        sampling = sampling or self.sampling
        return self.receipt(self.server.complete(prompt, max_tokens, sampling.temperature, sampling.seed))

    def receipt(self, done: Completion) -> Receipt:
        plan, body, delta = self.server.plan, done.body, done.counters
        if protocol(done.engine).native:
            timings = body.get("timings", {})
            tokens = [int(t) for t in body.get("tokens", [])]
            text, stop = str(body.get("content", "")), STOP_REASONS.get(str(body.get("stop_type")), "stop")
            prompt_n = int(timings.get("prompt_n", 0)) + int(timings.get("cache_n", 0))
            prefill_s, decode_s = timings.get("prompt_ms", 0.0) / 1000, timings.get("predicted_ms", 0.0) / 1000
            proposed, accepted = int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))
            chunks = math.ceil(int(timings.get("prompt_n", 0)) / max(1, plan.runtime.ubatch))
            rounds = max(0, int(delta.get("n_decode_total", 0)) - chunks) or len(tokens)
            settings = {key: value for key, value in body.get("generation_settings", {}).items()
                        if key.startswith("speculative") or key in ("seed", "temperature")}
        else:
            choice = body["choices"][0]
            tokens = [int(t) for t in choice.get("token_ids") or []]
            text, stop = str(choice.get("text", "")), "length" if choice.get("finish_reason") == "length" else "stop"
            prompt_n = int(body.get("usage", {}).get("prompt_tokens", 0))
            prefill_s, decode_s, timings, settings = 0.0, done.wall_s, {}, {}
            proposed = int(delta.get("spec_decode_num_draft_tokens_total", 0))
            accepted = int(delta.get("spec_decode_num_accepted_tokens_total", 0))
            rounds = len(tokens)
        identity = self.server.identity()
        return Receipt(
            plan_digest=plan.digest, artifacts=self.artifacts, mode=plan.mode.resolved, prompt_tokens=prompt_n,
            token_ids=tokens, text=text, stop_reason=stop, rounds=rounds, proposed=proposed, accepted=accepted,
            replays=0, clamps=0, fallbacks=0, load_s=self.server.load_s, prefill_s=prefill_s, decode_s=decode_s,
            speculative_rounds=int(delta.get("spec_decode_num_drafts_total", 0)),
            runtime={"engine": done.engine, "build": identity.get("build"), "threads": identity.get("threads"),
                     "timings": timings, "counters": delta, "wall_s": done.wall_s, "generation_settings": settings})
