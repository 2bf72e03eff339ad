"""Why two greedy outputs differ: the target's own probabilities at the first divergence, read without speculation.

Greedy speculative output must equal the target's own; on engines whose kernels
depend on the batch's row count (llama.cpp on CUDA, and its CPU build on prose)
two configurations can still part where the target's top two tokens are all but
tied, which is arithmetic, not a bug. To tell the two apart, the baseline's
tokens up to the first divergence are replayed through the candidate's target
as a prompt (teacher-forced) and only the next token's distribution is read:
one token from the prefill, so no draft is ever proposed. llama-server's
`/completion` gives it with `n_probs` (pre-sampling log-probabilities of the
top tokens over the whole vocabulary).

A divergence's margin is the gap between the two tokens' log-probabilities. A
shape is `exact` when every greedy output matched, `near-tie` when every
divergence's margin is within the policy's (`--near-tie-margin`), and `lossy`
otherwise: a token the target itself prefers by a clear margin was replaced.
Power's runtime is exact by construction, so on it any divergence is lossy.
"""

from __future__ import annotations

from typing import Any, Protocol

EXACT, NEAR_TIE, LOSSY = "exact", "near-tie", "lossy"
# How many of the target's top tokens are read at a divergence: both tokens are almost always among them.
TOP_TOKENS = 40
# Nats between the two tokens' log-probabilities below which a flip is taken for arithmetic (the bench's default).
DEFAULT_MARGIN = 0.1


class Replayer(Protocol):
    """A live engine that completes a prompt given as text then token ids (llama-server's /completion)."""

    def post_json(self, path: str, body: dict[str, Any]) -> Any: ...


def first_divergence(baseline: list[int], candidate: list[int]) -> int | None:
    """The first position where the two token lists differ (one ending early counts), None when identical."""
    for position, (a, b) in enumerate(zip(baseline, candidate, strict=False)):
        if a != b:
            return position
    return None if len(baseline) == len(candidate) else min(len(baseline), len(candidate))


def explain(replayer: Replayer, prompt: str, baseline: list[int], candidate: list[int], run: int) -> dict[str, Any]:
    """The target's log-probabilities for both tokens at the first divergence, on the shared prefix."""
    position = first_divergence(baseline, candidate)
    assert position is not None, "explain() is for outputs that differ"
    shared = baseline[:position]
    body = replayer.post_json("/completion", {
        "prompt": [prompt, *shared] if shared else prompt, "n_predict": 1, "n_probs": TOP_TOKENS,
        "temperature": 0.0, "cache_prompt": False, "return_tokens": True})
    top = {int(entry["id"]): float(entry["logprob"])
           for entry in body["completion_probabilities"][0]["top_logprobs"]}
    tokens = {"baseline": baseline[position] if position < len(baseline) else None,
              "candidate": candidate[position] if position < len(candidate) else None}
    return {"run": run, "position": position, "baseline_token": tokens["baseline"],
            "candidate_token": tokens["candidate"],
            "baseline_logprob": top.get(tokens["baseline"]) if tokens["baseline"] is not None else None,
            "candidate_logprob": top.get(tokens["candidate"]) if tokens["candidate"] is not None else None,
            "margin": _margin(top, tokens["baseline"], tokens["candidate"]),
            "target_top_token": max(top, key=top.__getitem__)}


def _margin(top: dict[int, float], baseline: int | None, candidate: int | None) -> float | None:
    """The gap between the two tokens' log-probabilities; a token outside the top counts at the top's floor (so the
    gap is a lower bound). None when it cannot be told: an output that ended there, or neither token in the top."""
    if baseline is None or candidate is None or (baseline not in top and candidate not in top):
        return None
    floor = min(top.values())
    return abs(top.get(baseline, floor) - top.get(candidate, floor))


def classify(divergences: list[dict[str, Any]], margin: float) -> str:
    """exact (none), near-tie (every margin within `margin`), lossy (one beyond it, or one that cannot be told)."""
    if not divergences:
        return EXACT
    return NEAR_TIE if all(d["margin"] is not None and d["margin"] <= margin for d in divergences) else LOSSY
