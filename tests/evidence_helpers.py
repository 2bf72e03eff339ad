"""Evidence documents for the rollout gates, built through the one evidence schema (power.documents.evidence) that
`power bench` writes through, with chosen speedups, parity and counters instead of a measured run."""

from __future__ import annotations

import json
from pathlib import Path

from power.documents.evidence import Evidence

SHAPES = ("prose", "echo", "structured", "identity")


def _summary(tok_s: float, runs: int, replays: int = 0, fallbacks: int = 0) -> dict:
    return {"requests": runs, "decode_tok_s": tok_s, "decode_tok_s_min": tok_s, "decode_tok_s_max": tok_s,
            "decode_tok_s_runs": [tok_s] * runs, "prefill_tok_s": 100.0, "generated_tokens": 32, "rounds": 16,
            "draft_n": 24, "draft_n_accepted": 16, "acceptance": 16 / 24, "mean_accepted_length": 1.0,
            "tokens_per_round": 2.0, "replays": replays, "clamps": 0, "fallbacks": fallbacks, "governor_parks": 0,
            "tokens_sha256": ["ab" * 32] * runs, "text": "text"}


def _configuration(label: str, digest: str, engine: str) -> dict:
    return {"label": label, "plan": f"{digest[:12]}.json", "plan_digest": digest, "name": "plan", "mode": "mtp",
            "chain": ["mtp"], "k": 7, "s": 7, "verify_capacity": 8, "ngram": None, "engine": {"name": engine},
            "artifacts": {}}


def evidence_document(candidate: str, baseline: str, *, engine: str = "power", lossless: bool = True,
                      speedup: float = 1.4, shapes: tuple[str, ...] = SHAPES, replays: int = 0, fallbacks: int = 0,
                      runs: int = 4) -> dict:
    verdict = "faster" if speedup >= 1.05 else "slower" if speedup <= 0.95 else "no difference"
    results = {shape: {"prompt_sha256": "cd" * 32, "prompt_tokens": 64, "temperature": 0.0, "max_tokens": 32,
                       "favours": "test", "candidate": _summary(20.0 * speedup, runs, replays, fallbacks),
                       "baseline": _summary(20.0, runs), "parity": lossless, "vacuous": False, "speedup": speedup,
                       "verdict": verdict if lossless else "lossy", "verdict_reason": "chosen by the test"}
               for shape in shapes}
    return Evidence.model_validate({
        "schema": "power.evidence/v1", "created": "2026-01-01T00:00:00Z", "power_version": "test",
        "engine": {"name": engine}, "machine": {},
        "protocol": {"shapes": list(shapes), "runs": runs, "max_tokens": 32, "prompt_tokens": dict.fromkeys(shapes, 64),
                     "order": "alternating", "warmup_requests": 1},
        "candidate": _configuration("candidate", candidate, engine),
        "baseline": _configuration("baseline", baseline, engine), "shapes": results,
        "lossless": {"shape": "identity", "mismatched_shapes": [], "vacuous_shapes": [], "tokens_sha256": None,
                     "texts": None, "proven": lossless, "reason": "chosen by the test"},
        "negative_control": None, "passed": lossless, "receipts": []}).document()


def write_evidence(path: Path, candidate: str, baseline: str, **options) -> Path:
    path.write_text(json.dumps(evidence_document(candidate, baseline, **options)))
    return path
