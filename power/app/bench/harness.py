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
from power.app.bench.divergence import DEFAULT_MARGIN, EXACT, LOSSY, NEAR_TIE, classify, first_divergence
from power.app.bench.quiet import HostWatch
from power.app.bench.residency import Residency
from power.app.bench.traffic import TrafficShape, build_shape
from power.artifacts.atomic import write_text_atomic
from power.documents.evidence import BASELINE, CANDIDATE, MIN_RUNS, SCHEMA, Evidence
from power.documents.plan import ResolvedPlan
from power.documents.receipt import Receipt, acceptance_by_position, summed_positions
from power.documents.verdicts import pairs
from power.runtime.sampling import SamplingParams

WARMUP_SHAPE = "identity"
# Greedy outputs this short (or blank) are identical for free: they prove nothing about losslessness.
VACUOUS_TOKENS = 4
# The figures a verdict judges, each its summary key: steady decode, and the whole request as a user waits for it.
DECODE, REQUEST = "decode", "request-wide"
FIGURES = {DECODE: "decode_tok_s", REQUEST: "request_tok_s"}


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
                 progress: Callable[[str], None], watch: HostWatch | None = None) -> list[Measurement]:
    """One unmeasured warm-up request per configuration, then per shape `runs` alternating pairs; the host sampled
    before and after (`watch`)."""
    warmup = build_shape(WARMUP_SHAPE)
    if watch:
        watch.observe("all", "before")
    for config in configs:
        progress(f"warm-up: {config.label}")
        _generate(config, warmup, 0)
    measurements = []
    for shape in shapes:
        for run in range(runs):
            for config in (configs if run % 2 == 0 else configs[::-1]):
                receipt = _generate(config, shape, run)
                progress(_line(shape, run, runs, config, receipt))
                measurements.append(Measurement(shape.name, config.label, run, receipt))
    if watch:
        watch.observe("all", "after")
    return measurements


def require_prompts_fit(plans: list[tuple[str, Path, ResolvedPlan]], shapes: list[TrafficShape],
                        root: Path | None) -> None:
    """Every prompt the protocol sends Power's runtime (the warm-up's included) fits each plan's context, counted
    with the target's tokenizer read from its header: refused (PWR602) before any model loads, not after."""
    from power.artifacts.gguf_reader import read_header
    from power.runtime.engine import context_room
    from power.runtime.errors import ContextOverflow
    from power.runtime.tokenizer import Tokenizer
    from power.runtime.workload import Workload

    for label, path, plan in plans:
        tokenizer = Tokenizer.from_gguf(read_header(Workload.of_plan(plan, path, root).target.path))
        for shape in [build_shape(WARMUP_SHAPE), *shapes]:
            for prompt in dict.fromkeys(shape.prompts):
                try:
                    context_room(len(tokenizer.encode(prompt)), shape.max_tokens, plan.runtime)
                except ContextOverflow as overflow:
                    raise ContextOverflow(f"{label} plan, traffic shape {shape.name}: "
                                          f"{overflow.finding.message} (with {shape.max_tokens} tokens to generate)",
                                          file=str(path), hint="lower --prompt-tokens or --max-tokens, or plan a "
                                          "larger ctx") from None


def run_in_turns(configs: list[BenchConfig], shapes: list[TrafficShape], runs: int, progress: Callable[[str], None],
                 bring_up: Callable[[BenchConfig], None], take_down: Callable[[BenchConfig], None],
                 watch: HostWatch | None = None,
                 during_turn: Callable[[BenchConfig, int], None] | None = None) -> list[Measurement]:
    """One configuration resident at a time: per run each configuration in turn, the order swapping every run, is
    brought up, warmed with one unmeasured request, measured on every shape, and taken down (also on a failure);
    the host sampled before and after each turn's measurements (`watch`)."""
    warmup = build_shape(WARMUP_SHAPE)
    measurements = []
    for run in range(runs):
        for config in (configs if run % 2 == 0 else configs[::-1]):
            bring_up(config)
            try:
                progress(f"run {run + 1}/{runs}: warm-up {config.label}")
                _generate(config, warmup, 0)
                if watch:
                    watch.observe(config.label, "before")
                for shape in shapes:
                    receipt = _generate(config, shape, run)
                    progress(_line(shape, run, runs, config, receipt))
                    measurements.append(Measurement(shape.name, config.label, run, receipt))
                if during_turn:
                    during_turn(config, run)  # what else must run while this configuration is up (its load levels)
                if watch:
                    watch.observe(config.label, "after")
            finally:
                take_down(config)
    return measurements


def _line(shape: TrafficShape, run: int, runs: int, config: BenchConfig, receipt: Receipt) -> str:
    return (f"{shape.name} run {run + 1}/{runs} {config.label}: {len(receipt.token_ids)} tokens at "
            f"{receipt.decode_tok_s:.2f} tok/s, {receipt.accepted}/{receipt.proposed} drafts accepted")


def _generate(config: BenchConfig, shape: TrafficShape, run: int) -> Receipt:
    sampling = replace(config.engine.sampling, temperature=shape.temperature)
    return config.engine.generate(shape.prompt_for(run), shape.max_tokens, sampling=sampling)


def evidence(candidate: BenchConfig, baseline: BenchConfig | None, shapes: list[TrafficShape], runs: int,
             max_tokens: int, measurements: list[Measurement], residency: Residency | None = None,
             lifecycle: list[dict[str, Any]] | None = None, host: dict[str, Any] | None = None,
             explained: dict[str, list[dict[str, Any]]] | None = None, margin: float = DEFAULT_MARGIN
             ) -> dict[str, Any]:
    """The `power.evidence/v1` document for one candidate (of possibly several that ran) against the baseline;
    `host`: the quiet-host samples (`power.app.bench.quiet`), a busy host said in every shape's verdict; `explained`:
    each shape's divergences (`divergences`), classified with the near-tie `margin`."""
    roles = {candidate.label: CANDIDATE} | ({baseline.label: BASELINE} if baseline else {})
    per_shape = {shape.name: shape_result(shape, {role: receipts_of(measurements, shape.name, label)
                                                  for label, role in roles.items()},
                                          (explained or {}).get(shape.name), margin)
                 for shape in shapes}
    if host and host["busy"]:
        for result in per_shape.values():
            result["verdict_reason"] += f"; measured on a busy host ({host['reason']})"
    lossless = _lossless(per_shape, list(roles.values()))
    return Evidence.model_validate({
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "power_version": __version__,
        "engine": candidate.engine.identity(),
        "machine": machine(),
        "protocol": {"shapes": [s.name for s in shapes], "runs": runs, "max_tokens": max_tokens,
                     "prompt_tokens": {s.name: per_shape[s.name]["prompt_tokens"] for s in shapes},
                     "order": "alternating", "warmup_requests": 1}
                    | ({"residency": residency.protocol, "residency_reason": residency.reason} if residency else {}),
        CANDIDATE: candidate.document(CANDIDATE),
        BASELINE: baseline.document(BASELINE) if baseline else None,
        "shapes": per_shape,
        "lossless": lossless,
        "negative_control": _negative_control(per_shape) if baseline else None,
        "passed": lossless["proven"],
        "receipts": [{"shape": m.shape, "config": roles[m.label], "run": m.run, "receipt": m.receipt.document()}
                     for m in measurements if m.label in roles],
        "lifecycle": lifecycle or [],
        "host": host,
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


def receipts_of(measurements: list[Measurement], shape: str, label: str) -> list[Receipt]:
    return [m.receipt for m in measurements if m.shape == shape and m.label == label]


def summarise(receipts: list[Receipt]) -> dict[str, Any]:
    """One configuration's figures on one shape: medians and spread of rates, sums of counters."""
    rates = [r.decode_tok_s for r in receipts]
    request_rates = [r.request_tok_s for r in receipts]
    ttfts = [r.ttft_s for r in receipts]
    proposed = sum(r.proposed for r in receipts)
    accepted = sum(r.accepted for r in receipts)
    speculative_rounds = sum(r.speculative_rounds for r in receipts)
    rounds = sum(r.rounds for r in receipts)
    decoded = sum(max(0, len(r.token_ids) - 1) for r in receipts)
    reached, hits = (
        summed_positions(r.position_reached for r in receipts),
        summed_positions(r.position_accepted for r in receipts),
    )
    return {
        "requests": len(receipts),
        "decode_tok_s": statistics.median(rates),
        "decode_tok_s_min": min(rates),
        "decode_tok_s_max": max(rates),
        "decode_tok_s_runs": rates,
        "request_tok_s": statistics.median(request_rates),
        "request_tok_s_min": min(request_rates),
        "request_tok_s_max": max(request_rates),
        "request_tok_s_runs": request_rates,
        "ttft_s": statistics.median(ttfts),
        "ttft_s_min": min(ttfts),
        "ttft_s_max": max(ttfts),
        "prefill_tok_s": statistics.median(r.prefill_tok_s for r in receipts),
        "generated_tokens": statistics.median_low(len(r.token_ids) for r in receipts),
        "rounds": rounds,
        "draft_n": proposed,
        "draft_n_accepted": accepted,
        "acceptance": accepted / proposed if proposed else 0.0,
        "mean_accepted_length": accepted / speculative_rounds if speculative_rounds else 0.0,
        "tokens_per_round": decoded / rounds if rounds else 0.0,
        "acceptance_by_position": acceptance_by_position(reached, hits),
        "replays": sum(r.replays for r in receipts),
        "clamps": sum(r.clamps for r in receipts),
        "fallbacks": sum(r.fallbacks for r in receipts),
        "governor_parks": sum(r.governor_parks for r in receipts),
        "target_only_tok_s": statistics.median(plain)
        if (plain := [r.plain_tok_s for r in receipts if r.plain_tok_s])
        else None,
        "tokens_sha256": [r.tokens_sha256 for r in receipts],
        "text": receipts[0].text,
    }


def shape_result(shape: TrafficShape, receipts: dict[str, list[Receipt]],
                 divergences: list[dict[str, Any]] | None = None, margin: float = DEFAULT_MARGIN) -> dict[str, Any]:
    """`divergences`: the first divergence of each differing greedy pair, explained by the candidate's target
    (`power.app.bench.divergence`); without them a greedy difference is lossy."""
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
        return result | {"speedup": None, "request_speedup": None, "judged": {}, "verdict": "measured",
                         "verdict_reason": "no baseline (--vs) to compare with"}
    judged = {figure: _judge(result[CANDIDATE], result[BASELINE], figure) for figure in FIGURES}
    verdict, reason = _verdict(result[CANDIDATE], result[BASELINE], first.mode, judged)
    divergences = divergences or []
    exactness = (EXACT if result["parity"] or shape.temperature != 0.0
                 else classify(divergences, margin) if divergences else LOSSY)  # unexplained: lossy
    if exactness == NEAR_TIE:
        widest = max(d["margin"] for d in divergences)
        reason += (f"; greedy outputs differ only where the target's top two tokens are within {widest:.4f} nats "
                   f"(the near-tie margin is {margin}): arithmetic, not speculation")
    elif exactness == LOSSY:
        verdict, reason = "lossy", _lossy_reason(divergences, margin)
    result |= {"exactness": exactness, "near_tie_margin": margin, "divergences": divergences}
    return result | {"speedup": judged[DECODE].speedup, "request_speedup": judged[REQUEST].speedup,
                     "judged": {figure: judgement.verdict for figure, judgement in judged.items()},
                     "verdict": verdict, "verdict_reason": reason}


def _lossy_reason(divergences: list[dict[str, Any]], margin: float) -> str:
    clear = [d for d in divergences if d["margin"] is None or d["margin"] > margin]
    if not clear or clear[0].get("baseline_logprob") is None and clear[0].get("candidate_logprob") is None:
        return "greedy outputs differ between the configurations: a correctness bug, whatever the speed"
    d = clear[0]
    gap = "beyond the target's top tokens" if d["margin"] is None else f"{d['margin']:.4f} nats apart"
    return (f"greedy outputs differ at token {d['position']} (run {d['run'] + 1}): the baseline's "
            f"{d['baseline_token']} and the candidate's {d['candidate_token']} are {gap} in the target's own "
            f"distribution, beyond the near-tie margin {margin}: a correctness bug, whatever the speed")


def divergences(candidate: list[Receipt], baseline: list[Receipt], shape: TrafficShape,
                replay: Callable[[str, list[int], list[int], int], dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The first divergence of each run whose greedy tokens differ, explained by `replay` (the candidate's target
    without speculation); without one (Power's runtime, exact by construction) only where it happened."""
    found = []
    for run, (ours, theirs) in enumerate(zip(candidate, baseline, strict=True)):
        position = first_divergence(theirs.token_ids, ours.token_ids)
        if position is None or shape.temperature != 0.0:
            continue
        if replay is None:
            found.append({"run": run, "position": position, "baseline_token": _at(theirs.token_ids, position),
                          "candidate_token": _at(ours.token_ids, position), "baseline_logprob": None,
                          "candidate_logprob": None, "margin": None, "target_top_token": None})
        else:
            found.append(replay(shape.prompt_for(run), theirs.token_ids, ours.token_ids, run))
    return found


def _at(tokens: list[int], position: int) -> int | None:
    return tokens[position] if position < len(tokens) else None


def _vacuous(receipt: Receipt) -> bool:
    """Empty or near-empty: an output every configuration could match without generating anything."""
    return len(receipt.token_ids) < VACUOUS_TOKENS or not receipt.text.strip()


@dataclass(frozen=True)
class Judgement:
    """One figure (decode or request-wide tok/s) compared between the configurations."""

    verdict: str  # faster | slower | no difference
    speedup: float | None
    reason: str


def _judge(candidate: dict[str, Any], baseline: dict[str, Any], figure: str) -> Judgement:
    """The pairs' verdict (`power.documents.verdicts`): run r of both configurations sent the same request, one
    right after the other."""
    if baseline[FIGURES[figure]] <= 0:
        return Judgement("no difference", None, f"{figure}: the baseline generated no tokens to rate")
    key = FIGURES[figure]
    paired = pairs(candidate[f"{key}_runs"], baseline[f"{key}_runs"])
    return Judgement(paired.verdict, paired.median,
                     f"{figure}: candidate {paired.median:.2f}x the baseline's {figure} tok/s, {paired.describe()}")


def _verdict(candidate: dict[str, Any], baseline: dict[str, Any], mode: str,
             judged: dict[str, Judgement]) -> tuple[str, str]:
    """Faster only when decode and request-wide both are; slower when either is; the reason names the figure."""
    reasons = "; ".join(judgement.reason for judgement in judged.values())
    runs = min(candidate["requests"], baseline["requests"])
    if runs < MIN_RUNS:
        return "measured", (f"{reasons} over {runs} run(s): a verdict needs {MIN_RUNS} or more (--runs), since "
                            "fewer pairs give no bound on the median ratio")
    if mode != "none" and candidate["draft_n"] == 0:
        return "no difference", f"{reasons}; but it drafted nothing ({mode}): the difference is not its speculation's"
    verdicts = {figure: judgement.verdict for figure, judgement in judged.items()}
    if slower := [figure for figure, verdict in verdicts.items() if verdict == "slower"]:
        return "slower", f"slower on {' and '.join(slower)}: {reasons}"
    if not_faster := [figure for figure, verdict in verdicts.items() if verdict != "faster"]:
        return "no difference", f"not faster on {' and '.join(not_faster)}: {reasons}"
    return "faster", reasons


def _lossless(per_shape: dict[str, dict[str, Any]], labels: list[str]) -> dict[str, Any]:
    """`proven`: every greedy output identical (what Power's runtime and the default gate demand); `exactness` the
    worst greedy shape's, and `proven_to_near_ties`: proven but for shapes whose divergences are all near-ties."""
    greedy = {name: r for name, r in per_shape.items() if r["temperature"] == 0.0}
    mismatched = [name for name, r in greedy.items() if not r["parity"]]
    classes = {r.get("exactness", EXACT) for r in greedy.values()}
    exactness = next((c for c in (LOSSY, NEAR_TIE) if c in classes), EXACT)
    proof = _proof(per_shape, greedy, mismatched, labels)
    near_ties = [name for name in mismatched if greedy[name].get("exactness") == NEAR_TIE]
    but_near_ties = proof["proven"] or (exactness == NEAR_TIE and _proof(
        per_shape, greedy, [name for name in mismatched if name not in near_ties], labels)["proven"])
    return proof | {"exactness": exactness, "near_tie_shapes": near_ties, "proven_to_near_ties": but_near_ties}


def _proof(per_shape: dict[str, dict[str, Any]], greedy: dict[str, dict[str, Any]], mismatched: list[str],
           labels: list[str]) -> dict[str, Any]:
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
        return proof | {"proven": False, "reason": "greedy outputs differ between the configurations on: "
                                                   f"{', '.join(mismatched)}"}
    if identity is None:
        return proof | {"proven": False, "reason": "the identity shape did not run: add it to --shapes for the proof"}
    if vacuous:
        return proof | {"proven": False, "reason": f"the greedy outputs on {', '.join(vacuous)} are empty or shorter "
                        f"than {VACUOUS_TOKENS} tokens: identical outputs that say nothing prove nothing"}
    tokens = identity[CANDIDATE]["generated_tokens"]
    return proof | {"proven": True, "reason": f"identity: both configurations emitted the same {tokens} "
                                              "tokens in every run; every shape at temperature 0 matched "
                                              f"({', '.join(greedy)})"}


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
