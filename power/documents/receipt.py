"""The run receipt: versioned evidence of one generation (`schema = "power.receipt/v1"`).

Later issues extend it (bench, rollout gates read it); fields are only ever
added. `tokens_sha256` is the sha256 of the emitted token IDs (the prompt
excluded) serialised as little-endian uint32, one after another - so two runs
emitted the same stream exactly when their digests agree.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from power.artifacts.atomic import write_text_atomic

RECEIPT_SCHEMA = "power.receipt/v1"
STOP_REASONS = ("stop", "length", "context", "cancelled")


def tokens_sha256(token_ids: Sequence[int]) -> str:
    return hashlib.sha256(np.asarray(token_ids, dtype="<u4").tobytes()).hexdigest()


def count_positions(reached: list[int], accepted: list[int], proposed: int, accepted_drafts: int) -> None:
    """Add one verified round to the per-position counts: it reached every position up to its first rejection."""
    for position in range(proposed):
        if position == len(reached):
            reached.append(0)
            accepted.append(0)
        reached[position] += accepted_drafts >= position
        accepted[position] += accepted_drafts > position


def summed_positions(counts: Iterable[Sequence[int]]) -> list[int]:
    """Per-position counts added up across requests (each request's as long as its longest proposal)."""
    rows = list(counts)
    width = max(map(len, rows), default=0)
    return [sum(row[i] for row in rows if i < len(row)) for i in range(width)]


def acceptance_by_position(reached: Sequence[int], accepted: Sequence[int]) -> list[float]:
    return [hit / seen if seen else 0.0 for seen, hit in zip(reached, accepted, strict=True)]


class SpeculationRates:
    """Rates over the speculation counters, shared by the decoder's stats and the receipt."""

    accepted: int
    proposed: int
    speculative_rounds: int
    position_reached: list[int]  # [e]: rounds whose proposal had a draft at position e and accepted the e before it
    position_accepted: list[int]  # [e]: of those, the rounds that accepted the draft at e too

    @property
    def acceptance_by_position(self) -> list[float]:
        """The acceptance of each draft position, conditional on reaching it (a speculative-decoding
        paper's acceptance table)."""
        return acceptance_by_position(self.position_reached, self.position_accepted)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Accepted proposals per round that proposed (llama.cpp's mean accepted length)."""
        return self.accepted / self.speculative_rounds if self.speculative_rounds else 0.0


@dataclass(frozen=True)
class Receipt(SpeculationRates):
    plan_digest: str | None  # None for a direct `--gguf` run without a plan
    artifacts: dict[str, str]  # path -> sha256
    mode: str
    prompt_tokens: int
    token_ids: list[int]
    text: str
    stop_reason: str  # one of STOP_REASONS
    rounds: int
    proposed: int
    accepted: int
    replays: int
    clamps: int
    fallbacks: int
    load_s: float
    prefill_s: float
    decode_s: float
    runtime: dict[str, Any] = field(default_factory=dict)  # device, dtype, threads, shapes, versions
    speculative_rounds: int = 0  # rounds that verified at least one proposal (llama.cpp's "drafts")
    governor_parks: int = 0
    # The target's own decode tok/s inside this engine (the cost governor's plain baseline; None without one)
    plain_tok_s: float | None = None
    # K as planned and as run: {"planned", "effective", "limited_by"} (`power.runtime.engine.ProposalWidth`)
    proposal_width: dict[str, Any] = field(default_factory=dict)
    prompt_reused: int = 0  # prompt positions taken from the slot's cache instead of computed (prefix reuse)
    # Per draft position (SpeculationRates); empty where the engine does not count them (a live llama-server)
    position_reached: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)

    @property
    def tokens_sha256(self) -> str:
        return tokens_sha256(self.token_ids)

    @property
    def prefill_tok_s(self) -> float:
        """Prompt tokens computed (those reused from a slot's cache excluded) per second of prefill."""
        computed = self.prompt_tokens - self.prompt_reused
        return computed / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        """Tokens after the first (which the prefill produced) per second of decoding."""
        decoded = len(self.token_ids) - 1
        return decoded / self.decode_s if decoded > 0 and self.decode_s > 0 else 0.0

    @property
    def ttft_s(self) -> float:
        """Time to first token: the prefill, which ends with the first token sampled."""
        return self.prefill_s

    @property
    def request_tok_s(self) -> float:
        """Request-wide: every generated token over the whole request, prefill included (what a user waits for)."""
        request_s = self.prefill_s + self.decode_s
        return len(self.token_ids) / request_s if self.token_ids and request_s > 0 else 0.0

    def document(self) -> dict[str, Any]:
        return {
            "schema": RECEIPT_SCHEMA,
            **asdict(self),
            "tokens_sha256": self.tokens_sha256,
            "prefill_tok_s": self.prefill_tok_s,
            "decode_tok_s": self.decode_tok_s,
            "request_tok_s": self.request_tok_s,
            "ttft_s": self.ttft_s,
            "acceptance": self.acceptance,
            "mean_accepted_length": self.mean_accepted_length,
            "acceptance_by_position": self.acceptance_by_position,
        }

    def published(self) -> Receipt:
        """The receipt as a server sends it to its clients: each artifact by its file name (a second file of the
        same name by "NAME (2)"), never by where it lies on this machine; the sha256 says which file it is."""
        names: dict[str, str] = {}
        for path, digest in self.artifacts.items():
            name, count = Path(path).name, 1
            while (key := name if count == 1 else f"{name} ({count})") in names:
                count += 1
            names[key] = digest
        return replace(self, artifacts=names)

    def to_json(self) -> str:
        return json.dumps(self.document(), ensure_ascii=False, indent=2) + "\n"

    def save(self, path: Path) -> None:
        write_text_atomic(Path(path), self.to_json())

    def summary(self) -> str:
        """One human line for the end of a streamed run."""
        return (f"[{self.stop_reason}] {self.prompt_tokens} prompt tokens at {self.prefill_tok_s:.1f} tok/s, "
                f"{len(self.token_ids)} generated at {self.decode_tok_s:.1f} tok/s; {self.rounds} rounds, "
                f"{self.accepted}/{self.proposed} drafts accepted (mean accepted length "
                f"{self.mean_accepted_length:.2f}), {self.replays} replays, {self.fallbacks} fallbacks; tokens sha256 "
                f"{self.tokens_sha256[:16]}...")
