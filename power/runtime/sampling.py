"""Sampling: greedy, and seeded stochastic draws from a counter-based random stream.

Every random number is a pure function of (seed, emitted position, lane): nothing
is consumed from a stateful generator. A speculative round that verifies rows it
later rejects therefore leaves no trace in the stream - the next round draws the
same uniform for that position that plain decoding would have drawn - and a
restored checkpoint needs no sampler state at all.

Every non-greedy token is drawn by one inverse CDF in token-ID order, in fixed
point (`power.kernels.dispatch.draw`, the rejection kernel's own draw): a plain
token and a speculative round's bonus or correction token round the same way.

Two verification rules use it:
- `match`: every row's token is drawn from the target distribution with the
  position's uniform; a proposal survives while it equals the draw. The emitted
  stream is token-for-token the autoregressive stream for the same seed.
- `rejection` (Leviathan et al. 2023; Chen et al. 2023): a proposal d drawn from
  the drafter's q is accepted with probability min(1, p(d)/q(d)); on rejection the
  correction is drawn from norm(max(0, p - q)). The output distribution equals p.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from power.kernels import dispatch

VERIFY_RULES = ("match", "rejection")
# Temperatures below this are greedy: dividing logits by less could overflow to inf and give NaN probabilities.
GREEDY_BELOW = 1e-5
_MASK64 = (1 << 64) - 1


class Lane(enum.IntEnum):
    """Independent uniforms drawn for one emitted position."""

    SAMPLE = 0  # the target draw (match rule, bonus and plain tokens)
    ACCEPT = 1  # the rejection rule's accept/reject coin
    RESIDUAL = 2  # the rejection rule's correction draw


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0 keeps the whole vocabulary
    top_p: float = 1.0
    seed: int = 0
    verify: str = "match"

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.verify not in VERIFY_RULES:
            raise ValueError(f"verify must be one of {', '.join(VERIFY_RULES)}, got {self.verify!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def draws_depend_on_proposals(self) -> bool:
        """Whether the emitted tokens depend on what was proposed: only the rejection rule at a temperature
        (greedy verification and the match rule emit the target's own draws whatever is proposed)."""
        return self.verify == "rejection" and not self.greedy


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def uniform(seed: int, position: int, lane: Lane = Lane.SAMPLE) -> float:
    """A uniform in [0, 1) that depends only on (seed, position, lane)."""
    x = _splitmix64(seed & _MASK64)
    x = _splitmix64(x ^ (position & _MASK64))
    x = _splitmix64(x ^ int(lane))
    return (x >> 11) * (1.0 / (1 << 53))


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution the sampler draws from: [vocab] float64 after temperature, top-k, top-p.

    Greedy is the one-hot of the argmax (ties resolve to the lowest token ID).
    """
    logits = logits.to(torch.float64)
    if params.greedy:
        probs = torch.zeros_like(logits)
        probs[int(torch.argmax(logits))] = 1.0
        return probs
    scaled = logits / params.temperature
    if 0 < params.top_k < scaled.numel():
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        probs = _nucleus(probs, params.top_p)
    return probs


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest most-probable set whose mass reaches top_p (the crossing token included)."""
    order = torch.sort(probs, descending=True, stable=True).indices
    mass_before = torch.cumsum(probs[order], dim=0) - probs[order]
    drop = order[mass_before >= top_p]
    kept = probs.clone()
    kept[drop] = 0.0
    return kept / kept.sum()


class Sampler:
    """Turns target logits rows into emitted tokens for one request."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return target_probs(logits, self.params)

    def sample(self, logits: torch.Tensor, position: int) -> int:
        """The token emitted at `position` (0-based index in the sequence) from its logits row."""
        if self.params.greedy:
            return int(torch.argmax(logits))
        return int(dispatch.draw(self.probs(logits), uniform(self.params.seed, position, Lane.SAMPLE)))
