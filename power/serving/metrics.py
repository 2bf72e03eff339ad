"""The server's Prometheus metrics: speculation counters, tokens, outcomes, rates, queue and slots."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from power.documents.receipt import Receipt

DECODE_TOK_S_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
TTFT_S_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    """The server's Prometheus metrics, in a registry of their own (one per app)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.drafts = Counter("power_spec_drafts", "Speculative rounds that proposed at least one token.", registry=r)
        self.draft_tokens = Counter("power_spec_draft_tokens", "Proposed draft tokens.", registry=r)
        self.accepted_tokens = Counter("power_spec_accepted_tokens", "Draft tokens the target accepted.", registry=r)
        self.replays = Counter("power_spec_replays", "Exact replays (a rejected suffix beyond the resident window).",
                               registry=r)
        self.clamps = Counter("power_spec_clamps", "Requests clamped to S proposals after a replay.", registry=r)
        self.fallbacks = Counter("power_spec_fallbacks", "One-way adaptive fallbacks to the target.", registry=r)
        self.governor_parks = Counter("power_governor_parks", "Times the cost governor parked the speculator.",
                                      registry=r)
        self.position_reached = Counter("power_spec_position_reached", "Rounds that reached draft position N (accepted "
                                        "the drafts before it).", ["position"], registry=r)
        self.position_accepted = Counter("power_spec_position_accepted",
                                         "Rounds that accepted the draft at position N.",
                                         ["position"], registry=r)
        self.generated_tokens = Counter("power_generated_tokens", "Tokens emitted.", registry=r)
        self.prompt_tokens = Counter("power_prompt_tokens", "Prompt tokens of finished requests.", registry=r)
        self.reused_tokens = Counter("power_prompt_reused_tokens", "Prompt tokens taken from a slot's cache.",
                                     registry=r)
        self.requests = Counter("power_requests", "Completion requests by outcome.", ["status"], registry=r)
        self.unauthorized = Counter("power_unauthorized_requests", "Requests refused with 401, by the key they sent "
                                    "(missing or wrong).", ["key"], registry=r)
        self.decode_tok_s = Histogram("power_decode_tokens_per_second", "Per-request decode rate "
                                                                        "(tokens after the first).",
                                      buckets=DECODE_TOK_S_BUCKETS, registry=r)
        self.ttft = Histogram("power_time_to_first_token_seconds", "Arrival to the first streamed text, "
                                                                   "queue wait included.",
                              buckets=TTFT_S_BUCKETS, registry=r)
        self.queue_depth = Gauge("power_queue_depth", "Requests waiting for a slot.", registry=r)
        self.slots_busy = Gauge("power_slots_busy", "Slots holding a request.", registry=r)
        self.ready = Gauge("power_ready", "1 once the plan's model is loaded.", registry=r)

    def record_receipt(self, receipt: Receipt) -> None:
        self.drafts.inc(receipt.speculative_rounds)
        self.draft_tokens.inc(receipt.proposed)
        self.accepted_tokens.inc(receipt.accepted)
        self.replays.inc(receipt.replays)
        self.clamps.inc(receipt.clamps)
        self.fallbacks.inc(receipt.fallbacks)
        self.governor_parks.inc(receipt.governor_parks)
        for position, (reached, accepted) in enumerate(zip(receipt.position_reached, receipt.position_accepted,
                                                           strict=True), start=1):
            self.position_reached.labels(position=str(position)).inc(reached)
            self.position_accepted.labels(position=str(position)).inc(accepted)
        self.generated_tokens.inc(len(receipt.token_ids))
        self.prompt_tokens.inc(receipt.prompt_tokens)
        self.reused_tokens.inc(receipt.prompt_reused)
        if len(receipt.token_ids) > 1:
            self.decode_tok_s.observe(receipt.decode_tok_s)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
