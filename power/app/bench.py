"""The A/B harness: paired, alternating runs of plans' engines over fixed traffic shapes -> evidence.

An engine is anything that turns a prompt into a `Receipt` and says what it is
(`identity()`): Power's runtime (`power.runtime.engine.Engine`, loaded in this
process) or a live server launched from the plan's render
(`power.app.live.LiveEngine`). Each is loaded once. Per shape the runs
alternate A/B, B/A, A/B, ... so neither configuration always runs second (warm
caches, thermal drift); with a sweep, every variant takes its turn the same way.
The result is the `power.evidence/v1` document described in docs/bench.md:
which engine and build produced it, per-shape summaries and verdicts, the
losslessness proof (every greedy shape's tokens identical across configurations,
and not vacuous; `identity` is the designated proof), the zero-draft negative
control, and every receipt.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Protocol

import torch

from power import __version__
from power.app.traffic import TrafficShape, build_shape
from power.artifacts.atomic import write_text_atomic
from power.documents.evidence import BASELINE, CANDIDATE, MIN_RUNS, SCHEMA, Evidence
from power.documents.plan import ResolvedPlan
from power.documents.receipt import Receipt, acceptance_by_position, summed_positions
from power.documents.verdicts import NOISE_BAND
from power.runtime.sampling import SamplingParams

WARMUP_SHAPE = "identity"
# Greedy outputs this short (or blank) are identical for free: they prove nothing about losslessness.
VACUOUS_TOKENS = 4


class BenchEngine(Protocol):
    """What the harness drives: Power's `Engine` or a live server (`power.app.served.ServedEngine`)."""

    @property
    def artifacts(self) -> dict[str, str]: ...

    @property
    def sampling(self) -> SamplingParams: ...

    def generate(self, prompt: str, max_tokens: int, *, sampling: SamplingParams | None = None) -> Receipt: ...

    def identity(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class BenchConfig:
    label: str  # CANDIDATE, BASELINE, or a sweep variant's label
    plan_path: Path
    plan: ResolvedPlan
    engine: BenchEngine

    def document(self, label: str | None = None) -> dict[str, Any]:
        plan = self.plan
        return {
            "label": label or self.label, "plan": str(self.plan_path), "plan_digest": plan.digest, "name": plan.name,
            "mode": plan.mode.resolved, "chain": list(plan.mode.chain), "k": plan.speculation.k,
            "s": plan.speculation.s, "verify_capacity": plan.runtime.verify_capacity,
            "ngram": [plan.runtime.ngram_match, plan.runtime.ngram_draft_min, plan.runtime.ngram_draft_max]
            if plan.runtime.ngram_match else None,
            "engine": self.engine.identity(),
            "artifacts": dict(self.engine.artifacts),
        }


@dataclass(frozen=True)
class Measurement:
    shape: str
    label: str
    run: int
    receipt: Receipt


def run_protocol(configs: list[BenchConfig], shapes: list[TrafficShape], runs: int,
                 progress: Callable[[str], None]) -> list[Measurement]:
    """One unmeasured warm-up request per configuration, then per shape `runs` alternating pairs."""
    warmup = build_shape(WARMUP_SHAPE)
    for config in configs:
        progress(f"warm-up: {config.label}")
        _generate(config, warmup, 0)
    measurements = []
    for shape in shapes:
        for run in range(runs):
            for config in (configs if run % 2 == 0 else configs[::-1]):
                receipt = _generate(config, shape, run)
                progress(f"{shape.name} run {run + 1}/{runs} {config.label}: {len(receipt.token_ids)} tokens at "
                         f"{receipt.decode_tok_s:.2f} tok/s, {receipt.accepted}/{receipt.proposed} drafts accepted")
                measurements.append(Measurement(shape.name, config.label, run, receipt))
    return measurements


def _generate(config: BenchConfig, shape: TrafficShape, run: int) -> Receipt:
    sampling = replace(config.engine.sampling, temperature=shape.temperature)
    return config.engine.generate(shape.prompt_for(run), shape.max_tokens, sampling=sampling)


def evidence(candidate: BenchConfig, baseline: BenchConfig | None, shapes: list[TrafficShape], runs: int,
             max_tokens: int, measurements: list[Measurement]) -> dict[str, Any]:
    """The `power.evidence/v1` document for one candidate (of possibly several that ran) against the baseline."""
    roles = {candidate.label: CANDIDATE} | ({baseline.label: BASELINE} if baseline else {})
    per_shape = {shape.name: shape_result(shape, {role: _receipts(measurements, shape.name, label)
                                                  for label, role in roles.items()})
                 for shape in shapes}
    lossless = _lossless(per_shape, list(roles.values()))
    return Evidence.model_validate({
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "power_version": __version__,
        "engine": candidate.engine.identity(),
        "machine": machine(),
        "protocol": {"shapes": [s.name for s in shapes], "runs": runs, "max_tokens": max_tokens,
                     "prompt_tokens": {s.name: per_shape[s.name]["prompt_tokens"] for s in shapes},
                     "order": "alternating", "warmup_requests": 1},
        CANDIDATE: candidate.document(CANDIDATE),
        BASELINE: baseline.document(BASELINE) if baseline else None,
        "shapes": per_shape,
        "lossless": lossless,
        "negative_control": _negative_control(per_shape) if baseline else None,
        "passed": lossless["proven"],
        "receipts": [{"shape": m.shape, "config": roles[m.label], "run": m.run, "receipt": m.receipt.document()}
                     for m in measurements if m.label in roles],
    }).document()


def machine() -> dict[str, Any]:
    return {
        "cpu": _cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
        "python": platform.python_version(), "torch": torch.__version__,
        "device": "cuda" if torch.cuda.is_available() else "cpu", "threads": torch.get_num_threads(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _receipts(measurements: list[Measurement], shape: str, label: str) -> list[Receipt]:
    return [m.receipt for m in measurements if m.shape == shape and m.label == label]


def summarise(receipts: list[Receipt]) -> dict[str, Any]:
    """One configuration's figures on one shape: medians and spread of rates, sums of counters."""
    rates = [r.decode_tok_s for r in receipts]
    proposed = sum(r.proposed for r in receipts)
    accepted = sum(r.accepted for r in receipts)
    speculative_rounds = sum(r.speculative_rounds for r in receipts)
    rounds = sum(r.rounds for r in receipts)
    decoded = sum(max(0, len(r.token_ids) - 1) for r in receipts)
    reached, hits = summed_positions(r.position_reached for r in receipts), summed_positions(r.position_accepted for r in receipts)
    return {
        "requests": len(receipts),
        "decode_tok_s": statistics.median(rates),
        "decode_tok_s_min": min(rates), "decode_tok_s_max": max(rates), "decode_tok_s_runs": rates,
        "prefill_tok_s": statistics.median(r.prefill_tok_s for r in receipts),
        "generated_tokens": statistics.median_low(len(r.token_ids) for r in receipts),
        "rounds": rounds, "draft_n": proposed, "draft_n_accepted": accepted,
        "acceptance": accepted / proposed if proposed else 0.0,
        "mean_accepted_length": accepted / speculative_rounds if speculative_rounds else 0.0,
        "tokens_per_round": decoded / rounds if rounds else 0.0,
        "acceptance_by_position": acceptance_by_position(reached, hits),
        "replays": sum(r.replays for r in receipts), "clamps": sum(r.clamps for r in receipts),
        "fallbacks": sum(r.fallbacks for r in receipts), "governor_parks": sum(r.governor_parks for r in receipts),
        "target_only_tok_s": statistics.median(plain) if (plain := [r.plain_tok_s for r in receipts if r.plain_tok_s]) else None,
        "tokens_sha256": [r.tokens_sha256 for r in receipts],
        "text": receipts[0].text,
    }


def shape_result(shape: TrafficShape, receipts: dict[str, list[Receipt]]) -> dict[str, Any]:
    first = receipts[CANDIDATE][0]
    result: dict[str, Any] = {
        "prompt_sha256": hashlib.sha256("\0".join(shape.prompts).encode()).hexdigest(),
        "prompt_tokens": first.prompt_tokens,
        "temperature": shape.temperature, "max_tokens": shape.max_tokens, "favours": shape.favours,
    }
    result |= {label: summarise(rs) for label, rs in receipts.items()}
    prompts = len(shape.prompts)  # run r sent prompt r % prompts: the runs on one prompt must agree
    result["parity"] = all(len({r.tokens_sha256 for rs in receipts.values() for r in rs[p::prompts]}) <= 1
                           for p in range(prompts))
    result["vacuous"] = any(_vacuous(r) for rs in receipts.values() for r in rs)
    if BASELINE not in receipts:
        return result | {"speedup": None, "verdict": "measured", "verdict_reason": "no baseline (--vs) to compare with"}
    verdict, reason, speedup = _verdict(result[CANDIDATE], result[BASELINE], first.mode, paired=len(shape.prompts) > 1)
    if shape.temperature == 0.0 and not result["parity"]:
        verdict, reason = "lossy", "greedy outputs differ between the configurations: a correctness bug, whatever the speed"
    return result | {"speedup": speedup, "verdict": verdict, "verdict_reason": reason}


def _vacuous(receipt: Receipt) -> bool:
    """Empty or near-empty: an output every configuration could match without generating anything."""
    return len(receipt.token_ids) < VACUOUS_TOKENS or not receipt.text.strip()


def _verdict(candidate: dict[str, Any], baseline: dict[str, Any], mode: str,
             paired: bool = False) -> tuple[str, str, float | None]:
    """`paired`: run r of both configurations sent the same request, and requests differ run to run (a natural
    shape), so the speedup is the median of the runs' ratios and the verdict asks every pair to agree."""
    if baseline["decode_tok_s"] <= 0:
        return "no difference", "the baseline decoded no tokens after the first", None
    speedup, apart, spread = (_paired(candidate, baseline) if paired else _unpaired(candidate, baseline))
    runs = min(candidate["requests"], baseline["requests"])
    if runs < MIN_RUNS:
        return "measured", (f"candidate {speedup:.2f}x the baseline's median decode tok/s over {runs} run(s): a "
                            f"verdict needs {MIN_RUNS} or more (--runs), since one run's range is a point"), speedup
    if mode != "none" and candidate["draft_n"] == 0:
        return "no difference", (f"candidate {speedup:.2f}x the baseline's median decode tok/s, but it drafted "
                                 f"nothing ({mode}): the difference is not its speculation's"), speedup
    if speedup >= 1 + NOISE_BAND and apart:
        return "faster", f"candidate {speedup:.2f}x the baseline's {spread}", speedup
    if speedup <= 1 - NOISE_BAND and apart:
        return "slower", f"candidate {speedup:.2f}x the baseline's {spread}", speedup
    return "no difference", f"candidate {speedup:.2f}x the baseline's {spread}", speedup


def _unpaired(candidate: dict[str, Any], baseline: dict[str, Any]) -> tuple[float, bool, str]:
    """One request repeated: the ratio of the medians, and whether the min-max ranges are apart."""
    speedup = candidate["decode_tok_s"] / baseline["decode_tok_s"]
    apart = candidate["decode_tok_s_min"] > baseline["decode_tok_s_max"] or candidate["decode_tok_s_max"] < baseline["decode_tok_s_min"]
    return speedup, apart, f"median decode tok/s; ranges {'do not overlap' if apart else 'overlap'}"


def _paired(candidate: dict[str, Any], baseline: dict[str, Any]) -> tuple[float, bool, str]:
    """A different request each run: the median of the per-request ratios, and whether every request agrees."""
    ratios = [c / b for c, b in zip(candidate["decode_tok_s_runs"], baseline["decode_tok_s_runs"], strict=True) if b > 0]
    faster = sum(ratio > 1 for ratio in ratios)
    apart = faster in (0, len(ratios))
    return statistics.median(ratios), apart, (f"decode tok/s, the median of {len(ratios)} paired requests; faster "
                                              f"on {faster} of them")


def _lossless(per_shape: dict[str, dict[str, Any]], labels: list[str]) -> dict[str, Any]:
    greedy = {name: r for name, r in per_shape.items() if r["temperature"] == 0.0}
    mismatched = [name for name, r in greedy.items() if not r["parity"]]
    vacuous = [name for name, r in greedy.items() if r["vacuous"]]
    identity = per_shape.get("identity")
    proof: dict[str, Any] = {"shape": "identity", "mismatched_shapes": mismatched, "vacuous_shapes": vacuous,
                             "tokens_sha256": None, "texts": None}
    if identity is not None:
        proof["tokens_sha256"] = {label: identity[label]["tokens_sha256"][0] for label in labels}
        proof["texts"] = {label: identity[label]["text"] for label in labels}
    if BASELINE not in labels:
        return proof | {"proven": False, "reason": "no baseline (--vs): nothing to compare the outputs with"}
    if mismatched:
        return proof | {"proven": False, "reason": f"greedy outputs differ between the configurations on: {', '.join(mismatched)}"}
    if identity is None:
        return proof | {"proven": False, "reason": "the identity shape did not run: add it to --shapes for the proof"}
    if vacuous:
        return proof | {"proven": False, "reason": f"the greedy outputs on {', '.join(vacuous)} are empty or shorter "
                        f"than {VACUOUS_TOKENS} tokens: identical outputs that say nothing prove nothing"}
    tokens = identity[CANDIDATE]["generated_tokens"]
    return proof | {"proven": True, "reason": f"identity: both configurations emitted the same {tokens} tokens in every run; "
                                              f"every shape at temperature 0 matched ({', '.join(greedy)})"}


def _negative_control(per_shape: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A zero-draft configuration proves the other configuration's drafts came from its proposer."""
    drafts = {label: sum(r[label]["draft_n"] for r in per_shape.values()) for label in (CANDIDATE, BASELINE)}
    control = min(drafts, key=drafts.__getitem__)
    other = CANDIDATE if control == BASELINE else BASELINE
    holds = drafts[control] == 0 and drafts[other] > 0
    if holds:
        reason = f"{control} proposed 0 tokens; {other} proposed {drafts[other]}: its drafts came from its proposer"
    else:
        reason = f"no zero-draft control: {CANDIDATE} proposed {drafts[CANDIDATE]}, {BASELINE} {drafts[BASELINE]}"
    return {"label": control, "draft_n": drafts, "holds": holds, "reason": reason}


def winner(documents: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The candidate to deploy: lossless, never slower (nor lossy) on a shape, faster on at least one, and the
    best geometric-mean speedup among those; None when no candidate qualifies (the incumbent stays).

    A candidate that wins on echo and loses on prose is a traffic decision, not a winner: it does not qualify.
    """
    def qualifies(document: dict[str, Any]) -> bool:
        verdicts = [r["verdict"] for r in document["shapes"].values()]
        return document["lossless"]["proven"] and "faster" in verdicts and not {"slower", "lossy"} & set(verdicts)

    def mean_speedup(document: dict[str, Any]) -> float:
        speedups = [r["speedup"] for r in document["shapes"].values() if r.get("speedup")]
        return statistics.geometric_mean(speedups) if speedups else 0.0

    return max((d for d in documents if qualifies(d)), key=mean_speedup, default=None)


def write_evidence(document: dict[str, Any], path: Path) -> None:
    """The document through the evidence schema (`power.documents.evidence`), then to `path` atomically."""
    checked = Evidence.model_validate(document).document()
    write_text_atomic(Path(path), json.dumps(checked, indent=2, ensure_ascii=False) + "\n")
