"""Reading `power bench` evidence files (`power.evidence/v1`, documented in docs/bench.md) for the rollout gates.

Only what the gates need is read: which plans were compared, on which engine
(and build), whether their greedy outputs were proven identical, and per traffic shape the paired decode
rates, the bench's speedup and verdict, output parity, and the candidate's
request, replay and fallback counts. A file that is not readable
evidence comes back as a PWR071 finding, never an exception.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from power.artifacts.documents import MAX_JSON_BYTES, DocumentError, decode_utf8, parse_json, read_bytes
from power.findings import Finding, Severity

EVIDENCE_SCHEMA = "power.evidence/v1"
CANDIDATE, BASELINE = "candidate", "baseline"
_HINT = "pass files written by `power bench CANDIDATE --vs INCUMBENT -o evidence.json`"


@dataclass(frozen=True)
class ShapeResult:
    shape: str
    candidate_tok_s: float
    baseline_tok_s: float
    speedup: float
    # faster | slower | no difference | lossy | measured (docs/bench.md: faster = >= 5 % and ranges apart)
    verdict: str
    parity: bool
    replays: int
    fallbacks: int
    requests: int


@dataclass(frozen=True)
class Evidence:
    path: Path
    sha256: str
    candidate_digest: str
    baseline_digest: str
    lossless: bool
    shapes: dict[str, ShapeResult]
    # the engine that produced it (evidence written before engines were recorded came from Power's runtime)
    engine: str = "power"
    engine_build: str = ""


def read_evidence(path: Path) -> tuple[Evidence | None, Finding | None]:
    path = Path(path)
    try:
        raw = read_bytes(path, MAX_JSON_BYTES)
        data = parse_json(decode_utf8(raw))
    except DocumentError as err:
        return None, err.finding("PWR071", path, _HINT, what="the evidence file")
    if not isinstance(data, dict) or data.get("schema") != EVIDENCE_SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        return None, _unreadable(path, f"not a {EVIDENCE_SCHEMA} document (schema is {found!r})")
    if data.get("baseline") is None:
        return None, _unreadable(path, "the bench ran without a baseline, so it compares the candidate with nothing")
    try:
        evidence = Evidence(
            path=path,
            sha256=hashlib.sha256(raw).hexdigest(),
            candidate_digest=str(data["candidate"]["plan_digest"]),
            baseline_digest=str(data["baseline"]["plan_digest"]),
            lossless=data["lossless"]["proven"] is True,
            shapes={name: _shape(name, result) for name, result in data["shapes"].items()},
            engine=str((data.get("engine") or {}).get("name", "power")),
            engine_build=str((data.get("engine") or {}).get("build", "")),
        )
    except (KeyError, TypeError, ValueError) as err:
        return None, _unreadable(path, f"the evidence document lacks or mistypes {err}")
    return evidence, None


def _shape(name: str, result: dict[str, Any]) -> ShapeResult:
    return ShapeResult(
        shape=name,
        candidate_tok_s=float(result["candidate"]["decode_tok_s"]),
        baseline_tok_s=float(result["baseline"]["decode_tok_s"]),
        speedup=float(result["speedup"]),
        verdict=str(result["verdict"]),
        parity=result["parity"] is True,
        replays=int(result["candidate"]["replays"]),
        fallbacks=int(result["candidate"]["fallbacks"]),
        requests=int(result["candidate"]["requests"]),
    )


def _unreadable(path: Path, message: str) -> Finding:
    return Finding(code="PWR071", severity=Severity.ERROR, message=message, file=str(path), hint=_HINT)
