"""The `power.evidence/v1` document: what `power bench` writes and the rollout gates read (docs/bench.md).

One schema for both halves: the A/B harness (`power.app.bench.harness`) builds its
document through `Evidence` before writing it, and the fleet's gates
(`power.orchestrator.fleet.evidence`) read files back through the same models,
so a field renamed, dropped or mistyped on one side fails on the other at once.
An engine's identity and the machine are recorded as the engine reports them
(their keys differ by engine); a run's receipts are `power.receipt/v1`
documents (`power.documents.receipt`).
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA: Final = "power.evidence/v1"
CANDIDATE, BASELINE = "candidate", "baseline"
# Fewer paired runs than this per shape cannot tell a speedup from noise: fewer pairs give no bound on the median ratio.
MIN_RUNS = 3
# faster | slower | no difference | lossy | measured (no baseline, or too few runs for a verdict)
Verdict = Literal["faster", "slower", "no difference", "lossy", "measured"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineIdentity(BaseModel):
    """Which engine and build measured (Power's runtime adds torch, device and dtype; a live engine its binary)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str
    build: str = ""


class Configuration(_Model):
    label: str
    plan: str
    plan_digest: str
    name: str
    mode: str
    chain: list[str]
    k: int
    s: int
    verify_capacity: int
    ngram: list[int | None] | None
    engine: EngineIdentity
    artifacts: dict[str, str]


class Summary(_Model):
    """One configuration's figures on one shape: medians and spread of rates, sums of counters."""

    requests: int
    decode_tok_s: float
    decode_tok_s_min: float
    decode_tok_s_max: float
    decode_tok_s_runs: list[float]
    # Request-wide: generated tokens over the whole request, prefill included; and the time to the first token
    request_tok_s: float
    request_tok_s_min: float
    request_tok_s_max: float
    request_tok_s_runs: list[float]
    ttft_s: float
    ttft_s_min: float
    ttft_s_max: float
    # the target's own decode rate inside the same engine (the receipts' plain_tok_s; None where not measured)
    target_only_tok_s: float | None = None
    prefill_tok_s: float
    generated_tokens: int
    rounds: int
    draft_n: int
    draft_n_accepted: int
    acceptance: float
    mean_accepted_length: float
    tokens_per_round: float
    # Each draft position's acceptance over the shape's requests, conditional on reaching it (empty: not counted)
    acceptance_by_position: list[float] = Field(default_factory=list)
    replays: int
    clamps: int
    fallbacks: int
    governor_parks: int
    tokens_sha256: list[str]
    text: str


Exactness = Literal["exact", "near-tie", "lossy"]


class Divergence(_Model):
    """The first divergence of one run's greedy outputs, with the candidate's target's log-probabilities for both
    tokens on the shared prefix (None where they could not be read: Power's runtime, or a token outside the top)."""

    run: int
    position: int
    baseline_token: int | None
    candidate_token: int | None
    baseline_logprob: float | None
    candidate_logprob: float | None
    margin: float | None
    target_top_token: int | None


class ShapeResult(_Model):
    prompt_sha256: str
    prompt_tokens: int
    temperature: float
    max_tokens: int
    favours: str
    candidate: Summary
    baseline: Summary | None = None
    parity: bool
    vacuous: bool
    speedup: float | None  # decode
    request_speedup: float | None
    # Each figure's own verdict, {"decode": ..., "request-wide": ...}: `verdict` is faster only when both are
    judged: dict[str, Literal["faster", "slower", "no difference"]]
    verdict: Verdict
    verdict_reason: str
    # exact: greedy outputs identical; near-tie: every divergence within `near_tie_margin` nats in the candidate's
    # target's own distribution; lossy: one beyond it (`power.app.bench.divergence`)
    exactness: Exactness = "exact"
    near_tie_margin: float | None = None
    divergences: list[Divergence] = Field(default_factory=list)


class Lossless(_Model):
    shape: str
    mismatched_shapes: list[str]
    vacuous_shapes: list[str]
    tokens_sha256: dict[str, str] | None
    texts: dict[str, str] | None
    proven: bool
    reason: str
    exactness: Exactness = "exact"  # the worst greedy shape's
    near_tie_shapes: list[str] = Field(default_factory=list)
    proven_to_near_ties: bool = False  # proven, but for shapes whose every divergence is a near-tie


class NegativeControl(_Model):
    label: str
    draft_n: dict[str, int]
    holds: bool
    reason: str


class Protocol(_Model):
    shapes: list[str]
    runs: int
    max_tokens: int
    prompt_tokens: dict[str, int]
    order: Literal["alternating"]
    warmup_requests: int
    # side-by-side: every configuration resident at once; sequential: one at a time, each warmed in its turn
    residency: Literal["side-by-side", "sequential"] = "side-by-side"
    residency_reason: str = ""


class Measured(_Model):
    shape: str
    config: Literal["candidate", "baseline"]
    run: int
    receipt: dict[str, Any]  # a power.receipt/v1 document


class Evidence(_Model):
    schema_: Literal["power.evidence/v1"] = Field(SCHEMA, alias="schema")
    created: str
    power_version: str
    engine: EngineIdentity
    machine: dict[str, Any]
    protocol: Protocol
    candidate: Configuration
    baseline: Configuration | None
    shapes: dict[str, ShapeResult]
    lossless: Lossless
    negative_control: NegativeControl | None
    passed: bool
    receipts: list[Measured]
    sweep: dict[str, Any] | None = None  # `power bench --sweep`: the variants' table and the winner
    # every start and stop, of the configurations and of the deployment's own server (`power.app.bench.lifecycle`)
    lifecycle: list[dict[str, Any]] = Field(default_factory=list)
    # the quiet-host samples (`power.app.bench.quiet`): load average, other processes' CPU share, busy or not
    host: dict[str, Any] | None = None
    # `--concurrency`: per level and shape the aggregate and per-request figures, and where the candidate stops
    # paying (`power.app.bench.concurrency`)
    concurrency: dict[str, Any] | None = None

    def document(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=False)
