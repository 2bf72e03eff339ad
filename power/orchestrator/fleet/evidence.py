"""Reading `power bench` evidence files (`power.evidence/v1`, documented in docs/bench.md) for the rollout gates.

The file is read through the one evidence schema (`power.documents.evidence`),
the models `power bench` writes it through.

Only what the gates need is read: which plans were compared, on which engine
(and build), whether their greedy outputs were proven identical, and per traffic shape the paired decode
and request-wide runs, the bench's speedups and verdicts, output parity, and the candidate's
request, replay and fallback counts. A file that is not readable
evidence comes back as a PWR071 finding, never an exception.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from power.artifacts.bounded_reader import MAX_JSON_BYTES, DocumentError, decode_utf8, parse_json, read_bytes
from power.documents.evidence import SCHEMA, ShapeResult
from power.documents.evidence import Evidence as EvidenceDocument
from power.findings import Finding, Severity

EVIDENCE_SCHEMA = SCHEMA
_HINT = "pass files written by `power bench CANDIDATE --vs INCUMBENT -o evidence.json`"


@dataclass(frozen=True)
class GatedShape:
    shape: str
    candidate_tok_s: float
    baseline_tok_s: float
    speedup: float
    # request-wide: generated tokens over the whole request, prefill included
    request_candidate_tok_s: float
    request_baseline_tok_s: float
    request_speedup: float
    # each figure's paired runs, (candidate's, incumbent's) tok/s, run r of both on the same request
    runs: dict[str, tuple[list[float], list[float]]]
    # faster | slower | no difference | lossy | measured (docs/bench.md: faster = the pairs' median ratio >= 5 %
    # with the bound on it above 1, on decode and request-wide both; `judged` holds each figure's own verdict)
    verdict: str
    judged: dict[str, str]
    # exact | near-tie | lossy, and each divergence's margin in nats (None: it could not be told)
    exactness: str
    margins: list[float | None]
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
    shapes: dict[str, GatedShape]
    # proven but for shapes whose every divergence is a near-tie (what a near-tie exactness policy accepts)
    lossless_to_near_ties: bool = False
    # `--concurrency`: {clients: {shape: the candidate's aggregate speedup (None: no baseline rate)}}
    under_load: dict[int, dict[str, float | None]] | None = None
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
        document = EvidenceDocument.model_validate(data)
    except ValidationError as err:
        problem = err.errors()[0]
        where = ".".join(str(part) for part in problem["loc"])
        return None, _unreadable(path, f"the evidence document does not match {EVIDENCE_SCHEMA} at {where}: "
                                       f"{problem['msg']}")
    return _gated(path, hashlib.sha256(raw).hexdigest(), document), None


def _gated(path: Path, sha256: str, document: EvidenceDocument) -> Evidence:
    """What the gates read of a document the schema accepted."""
    baseline = document.baseline
    assert baseline is not None  # refused above
    return Evidence(
        path=path, sha256=sha256, candidate_digest=document.candidate.plan_digest,
        baseline_digest=baseline.plan_digest, lossless=document.lossless.proven,
        lossless_to_near_ties=document.lossless.proven_to_near_ties, under_load=_under_load(document.concurrency),
        shapes={name: _shape(name, result) for name, result in document.shapes.items() if result.baseline},
        engine=document.engine.name, engine_build=document.engine.build)


def _under_load(section: dict | None) -> dict[int, dict[str, float | None]] | None:
    if not section:
        return None
    return {int(level): {shape: result.get("speedup") for shape, result in shapes.items()}
            for level, shapes in section.get("per_level", {}).items()}


def _shape(name: str, result: ShapeResult) -> GatedShape:
    assert result.baseline is not None
    return GatedShape(
        shape=name, candidate_tok_s=result.candidate.decode_tok_s, baseline_tok_s=result.baseline.decode_tok_s,
        speedup=result.speedup or 0.0, request_candidate_tok_s=result.candidate.request_tok_s,
        request_baseline_tok_s=result.baseline.request_tok_s, request_speedup=result.request_speedup or 0.0,
        runs={"decode": (result.candidate.decode_tok_s_runs, result.baseline.decode_tok_s_runs),
              "request-wide": (result.candidate.request_tok_s_runs, result.baseline.request_tok_s_runs)},
        verdict=result.verdict, judged=dict(result.judged), parity=result.parity, exactness=result.exactness,
        margins=[d.margin for d in result.divergences],
        replays=result.candidate.replays, fallbacks=result.candidate.fallbacks, requests=result.candidate.requests)


def _unreadable(path: Path, message: str) -> Finding:
    return Finding(code="PWR071", severity=Severity.ERROR, message=message, file=str(path), hint=_HINT)
