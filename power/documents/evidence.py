"""The `power.evidence/v1` document: what `power bench` writes and the rollout gates read (docs/bench.md).

One schema for both halves: the A/B harness (`power.app.bench`) builds its
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
# Fewer paired runs than this per shape cannot tell a speedup from noise: one run's min-max range is a point.
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
    speedup: float | None
    verdict: Verdict
    verdict_reason: str


class Lossless(_Model):
    shape: str
    mismatched_shapes: list[str]
    vacuous_shapes: list[str]
    tokens_sha256: dict[str, str] | None
    texts: dict[str, str] | None
    proven: bool
    reason: str


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

    def document(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=False)
