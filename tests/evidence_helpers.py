"""Evidence documents for the rollout gates, built through the one evidence schema (power.documents.evidence) that
`power bench` writes through, with chosen speedups, parity and counters instead of a measured run."""

from __future__ import annotations

import json
from pathlib import Path

from power.app.bench import harness
from power.documents.evidence import Evidence

SHAPES = ("prose", "echo", "structured", "identity")


def _summary(tok_s: float, runs: int, replays: int = 0, fallbacks: int = 0, request_tok_s: float | None = None) -> dict:
    request = tok_s / 2 if request_tok_s is None else request_tok_s
    return {"requests": runs, "decode_tok_s": tok_s, "decode_tok_s_min": tok_s, "decode_tok_s_max": tok_s,
            "decode_tok_s_runs": [tok_s] * runs, "request_tok_s": request, "request_tok_s_min": request,
            "request_tok_s_max": request, "request_tok_s_runs": [request] * runs, "ttft_s": 0.5, "ttft_s_min": 0.5,
            "ttft_s_max": 0.5, "prefill_tok_s": 100.0, "generated_tokens": 32, "rounds": 16,
            "draft_n": 24, "draft_n_accepted": 16, "acceptance": 16 / 24, "mean_accepted_length": 1.0,
            "tokens_per_round": 2.0, "replays": replays, "clamps": 0, "fallbacks": fallbacks, "governor_parks": 0,
            "tokens_sha256": ["ab" * 32] * runs, "text": "text"}


def _configuration(label: str, digest: str, engine: str) -> dict:
    return {"label": label, "plan": f"{digest[:12]}.json", "plan_digest": digest, "name": "plan", "mode": "mtp",
            "chain": ["mtp"], "k": 7, "s": 7, "verify_capacity": 8, "ngram": None, "engine": {"name": engine},
            "artifacts": {}}


def _verdict(speedup: float) -> str:
    return "faster" if speedup >= 1.05 else "slower" if speedup <= 0.95 else "no difference"


def evidence_document(candidate: str, baseline: str, *, engine: str = "power", lossless: bool = True,
                      speedup: float = 1.4, request_speedup: float | None = None, shapes: tuple[str, ...] = SHAPES,
                      replays: int = 0, fallbacks: int = 0, runs: int = 4, results: dict | None = None,
                      under_load: dict[int, float] | None = None) -> dict:
    """`results`: per-shape results as `power.app.bench.harness.shape_result` built them, in place of the chosen figures
    (and the losslessness the bench derives from them); `under_load`: {clients: the candidate's aggregate speedup} on
    every shape (`power bench --concurrency`)."""
    built = results is not None
    request_speedup = speedup if request_speedup is None else request_speedup
    judged = {"decode": _verdict(speedup), "request-wide": _verdict(request_speedup)}
    verdict = ("slower" if "slower" in judged.values() else "faster" if set(judged.values()) == {"faster"}
               else "no difference")
    results = results or {
        shape: {"prompt_sha256": "cd" * 32, "prompt_tokens": 64, "temperature": 0.0, "max_tokens": 32,
                "favours": "test",
                "candidate": _summary(20.0 * speedup, runs, replays, fallbacks, request_tok_s=10.0 * request_speedup),
                "baseline": _summary(20.0, runs, request_tok_s=10.0), "parity": lossless, "vacuous": False,
                "speedup": speedup, "request_speedup": request_speedup, "judged": judged,
                "verdict": verdict if lossless else "lossy", "verdict_reason": "chosen by the test"}
        for shape in shapes}
    return Evidence.model_validate({
        "schema": "power.evidence/v1", "created": "2026-01-01T00:00:00Z", "power_version": "test",
        "engine": {"name": engine}, "machine": {},
        "protocol": {"shapes": list(results), "runs": runs, "max_tokens": 32,
                     "prompt_tokens": dict.fromkeys(results, 64),
                     "order": "alternating", "warmup_requests": 1},
        "candidate": _configuration("candidate", candidate, engine),
        "baseline": _configuration("baseline", baseline, engine), "shapes": results,
        "lossless": harness._lossless(results, ["candidate", "baseline"]) if built else {
            "shape": "identity", "mismatched_shapes": [], "vacuous_shapes": [], "tokens_sha256": None, "texts": None,
            "proven": lossless, "reason": "chosen by the test"},
        "negative_control": None, "passed": lossless, "receipts": [],
        "concurrency": {"levels": sorted(under_load), "slots": max(under_load), "stops_paying_at": None,
                        "reason": "chosen by the test",
                        "per_level": {str(level): {shape: {"speedup": speedup} for shape in results}
                                      for level, speedup in under_load.items()}} if under_load else None}).document()


def write_evidence(path: Path, candidate: str, baseline: str, **options) -> Path:
    path.write_text(json.dumps(evidence_document(candidate, baseline, **options)))
    return path
