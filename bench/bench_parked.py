"""What a drafter that cannot win costs a plan: each kind and chain against target-only, in one run (issue 41).

    python bench/bench_parked.py [--per-shape 2] [--tokens 96] [--k 6] [--threads 2] [--mtp [LABEL=]FILE ...]
                                 [--calls] [--json out.json]

On the bundled Gemma 3 270M, an untrained drafter of each kind (`power.drafters.untrained`: the weights a
distillation starts from, whose drafts almost never land) runs as a plan runs it: the cost governor on, K/S = `--k`,
one decoder per plan kept across the requests (as an engine keeps its slot's governor), every plan on the same trunk.
`--mtp LABEL=FILE` (repeatable) runs distilled MTP sidecars instead: `mtp LABEL` and `ngram -> mtp LABEL` for each.
Per held-out prompt (`--per-shape` each of prose, code and chat) the plans run in turn, each right after a
target-only run of the same prompt that is its control, so a plan and its control see the same load; the load
average is read before every request. Reported per plan: the decode rate over its control's (per request: the median
and the worst), the median seconds of a plain round inside the plan beside its controls' own, the speculative
rounds, what they proposed and landed, and whether every greedy stream is bit-identical to target-only; and for the
worst request, its rate, its plain round and its control's, and the load average around it: a plain round that costs
what the control's does there says the load, not the plan, made the request slow. The first request of each plan is
its speculators' first ever (the step that measures each one); the worst ratio counts it. The JSON also holds the
median time a plain round spends outside its target forward (the forward is the same call in a plan and in
target-only), and, with `--calls`, each plan's and target-only's Python calls a plain round, counted over one more
request each and printed as a second table with the calls that differ most.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from power.app.bench.harness import machine
from power.drafters.export import CHAINED_NGRAM_DRAFT_MIN, CHAINED_NGRAM_MATCH
from power.drafters.prompt_sets import load_prompts
from power.drafters.untrained import write_untrained
from power.runtime.decoder import Decoder, Decoding, Generation
from power.runtime.gguf_weights import GGUFFile
from power.runtime.governor import GovernorConfig
from power.runtime.sampling import Sampler, SamplingParams
from power.runtime.scheduler import SchedulerConfig
from power.runtime.speculators import registry
from power.runtime.speculators.base import NGramWindow, Speculator, SpeculatorRequest
from power.runtime.speculators.chain import ChainSpeculator
from power.runtime.tokenizer import Tokenizer
from power.runtime.transaction import RoundResult
from power.runtime.trunks import load_trunk

GEMMA = Path(__file__).resolve().parents[1] / "models" / "gemma-3-270m-q4_k_m.gguf"
SHAPES = ("prose", "code", "chat")
PLANS = ("mtp", "dflash", "dspark", "ngram -> mtp", "ngram -> dspark")


@dataclass
class Round:
    plain: bool  # no speculator's pass
    seconds: float
    forward_s: float  # of which the target's forward
    calls: Counter[str] | None  # the Python calls it made, by function (counted rounds only)


class TimedTrunk:
    """The trunk as a decoder drives it, timing each decode forward for `timed`."""

    def __init__(self, trunk: Any) -> None:
        self.trunk = trunk
        self.timed: TimedDecoder | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.trunk, name)

    def forward_parts(self, parts: Any, taps: Any = ()) -> Any:
        started = time.perf_counter()
        try:
            return self.trunk.forward_parts(parts, taps)
        finally:
            if self.timed is not None:
                self.timed.forward_s += time.perf_counter() - started


class TimedDecoder(Decoder):
    """A decoder that keeps each round's wall time, its forward's and whether it was plain; while `counting`, each
    round's Python calls too (`sys.setprofile`: slow, so those rounds are not timed)."""

    def __init__(self, trunk: TimedTrunk, *args: Any, **kwargs: Any) -> None:
        super().__init__(trunk, *args, **kwargs)  # type: ignore[arg-type]
        self.timing = trunk
        self.rounds: list[Round] = []
        self.counting = False
        self.forward_s = 0.0
        self._calls: Counter[str] | None = None

    def _decode(self) -> None:
        self.timing.timed, self.forward_s = self, 0.0
        self._calls = Counter() if self.counting else None
        if self._calls is not None:
            sys.setprofile(self._count)
        try:
            super()._decode()
        finally:
            sys.setprofile(None)

    def _count(self, frame: Any, event: str, arg: Any) -> None:
        assert self._calls is not None
        if event == "call":
            self._calls[frame.f_code.co_qualname] += 1
        elif event == "c_call":
            self._calls[getattr(arg, "__qualname__", repr(arg))] += 1

    def _account(self, decoding: Decoding, result: RoundResult, seconds: float) -> None:
        self.rounds.append(Round(result.member is None, seconds, self.forward_s, self._calls))
        super()._account(decoding, result, seconds)


@dataclass
class Plan:
    name: str
    decoder: TimedDecoder
    runs: list[Generation] = field(default_factory=list)
    controls: list[Generation] = field(default_factory=list)  # target-only's run just before each of `runs`
    plain_round_s: list[list[float]] = field(default_factory=list)  # per request
    control_round_s: list[list[float]] = field(default_factory=list)
    load: list[tuple[float, float]] = field(default_factory=list)  # the 1-minute load average before, after
    outside_s: list[float] = field(default_factory=list)  # each plain round's seconds outside its forward
    control_outside_s: list[float] = field(default_factory=list)
    calls: list[Counter[str]] = field(default_factory=list)  # each counted plain round's Python calls
    control_calls: list[Counter[str]] = field(default_factory=list)

    def request(self, control: TimedDecoder, ids: list[int], tokens: int, stop: Any) -> None:
        """One prompt: target-only's run, then this plan's, each round's time kept."""
        before = load_average()
        for decoder, runs, rounds, outside in ((control, self.controls, self.control_round_s, self.control_outside_s),
                                               (self.decoder, self.runs, self.plain_round_s, self.outside_s)):
            decoder.rounds.clear()
            runs.append(decoder.generate(ids, tokens, stop))
            rounds.append([r.seconds for r in decoder.rounds if r.plain])
            outside.extend(r.seconds - r.forward_s for r in decoder.rounds if r.plain)
        self.load.append((before, load_average()))

    def count_calls(self, control: TimedDecoder, ids: list[int], tokens: int, stop: Any) -> None:
        """One prompt again, target-only then this plan, each round's Python calls counted (and not timed)."""
        for decoder, calls in ((control, self.control_calls), (self.decoder, self.calls)):
            decoder.rounds.clear()
            decoder.counting = True
            decoder.generate(ids, tokens, stop)
            decoder.counting = False
            calls.extend(r.calls for r in decoder.rounds if r.plain and r.calls is not None)


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def mtp_argument(value: str) -> tuple[str, Path]:
    """`LABEL=FILE` or `FILE` (labelled by its file name)."""
    label, _, path = value.rpartition("=")
    return label or Path(path).stem, Path(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-shape", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--k", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mtp", type=mtp_argument, action="append", default=[],
                        help="LABEL=FILE: a distilled MTP sidecar, run alone and behind n-gram (repeatable; default: "
                             "the untrained drafters of every kind)")
    parser.add_argument("--calls", action="store_true",
                        help="also count the Python calls of each plan's plain rounds against target-only's, over "
                             "one more request a plan (sys.setprofile: those rounds are not timed)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="power-parked-") as work:
        report = run(args, Path(work))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    target = GGUFFile(GEMMA)
    tokenizer = Tokenizer.from_gguf(target)
    trunk = load_trunk(target, n_ctx=1024, verify_capacity=args.k + 1)
    timing = TimedTrunk(trunk)
    if args.mtp:
        drafters = {f"mtp {label}": GGUFFile(path) for label, path in args.mtp}
        names = [name for head in drafters for name in (head, f"ngram -> {head}")]
    else:
        drafters = {kind: GGUFFile(write_untrained(kind, GEMMA, work / f"{kind}.gguf"))
                    for kind in ("dflash", "dspark")}
        drafters["mtp"] = GGUFFile(write_untrained("mtp", GEMMA, work / "mtp.gguf"))
        names = list(PLANS)
    window = NGramWindow(CHAINED_NGRAM_MATCH, CHAINED_NGRAM_DRAFT_MIN, args.k)

    def member(name: str) -> Speculator:
        kind = name.split()[0]
        return registry.create(kind, SpeculatorRequest(trunk, target=target, drafter=drafters.get(name), ngram=window))

    def plan(name: str) -> Plan:
        members = name.split(" -> ")
        speculator = member(members[0]) if len(members) == 1 else ChainSpeculator([member(m) for m in members])
        return Plan(name, TimedDecoder(timing, Sampler(SamplingParams()), speculator,
                                       SchedulerConfig(k=args.k, s=args.k), GovernorConfig()))

    control = TimedDecoder(timing, Sampler(SamplingParams()))
    plans = [plan(name) for name in names]
    prompts = [
        p for shape in SHAPES for p in [p for p in load_prompts(which="heldout") if p.shape == shape][: args.per_shape]
    ]
    control.generate(tokenizer.encode(prompts[-1].text), 8)  # warm the trunk: the first request ran cold
    for prompt in prompts:
        for p in plans:
            p.request(control, tokenizer.encode(prompt.text), args.tokens, tokenizer.stop_ids)
    if args.calls:
        for p in plans:
            p.count_calls(control, tokenizer.encode(prompts[0].text), args.tokens, tokenizer.stop_ids)
    report = {"machine": machine(), "threads": args.threads, "tokens": args.tokens, "k": args.k,
              "drafters": {name: str(file.path) for name, file in drafters.items()} if args.mtp else "untrained",
              "requests": len(prompts), "shapes": [p.shape for p in prompts],
              "plans": [summary(p) for p in plans]}
    print_table(report)
    if args.calls:
        print_calls(report)
    return report


def rate(generation: Generation) -> float:
    return (len(generation.tokens) - 1) / generation.stats.decode_s


def median_ms(rounds: list[list[float]]) -> float:
    return 1e3 * statistics.median(s for request in rounds for s in request)


def summary(plan: Plan) -> dict[str, Any]:
    ratios = [rate(mine) / rate(theirs) for mine, theirs in zip(plan.runs, plan.controls, strict=True)]
    worst = ratios.index(min(ratios))
    stats = [g.stats for g in plan.runs]
    return {"plan": plan.name, "tok_s": statistics.median(rate(g) for g in plan.runs),
            "target_only_tok_s": statistics.median(rate(g) for g in plan.controls),
            "ratio_median": statistics.median(ratios), "ratio_worst": ratios[worst], "ratios": ratios,
            "plain_round_ms": median_ms(plan.plain_round_s), "target_only_round_ms": median_ms(plan.control_round_s),
            "worst_request": {"index": worst, "tok_s": rate(plan.runs[worst]),
                              "target_only_tok_s": rate(plan.controls[worst]),
                              "plain_round_ms": median_ms(plan.plain_round_s[worst:worst + 1]),
                              "target_only_round_ms": median_ms(plan.control_round_s[worst:worst + 1]),
                              "speculative_rounds": stats[worst].speculative_rounds, "load": plan.load[worst]},
            "load": plan.load,
            "rounds": sum(s.rounds for s in stats), "speculative_rounds": sum(s.speculative_rounds for s in stats),
            "proposed": sum(s.proposed for s in stats), "accepted": sum(s.accepted for s in stats),
            "parks": sum(s.governor_parks for s in stats),
            "outside_forward_ms": 1e3 * statistics.median(plan.outside_s),
            "target_only_outside_forward_ms": 1e3 * statistics.median(plan.control_outside_s),
            **({"calls": mean_calls(plan.calls), "target_only_calls": mean_calls(plan.control_calls)}
               if plan.calls else {}),
            "identical": all(mine.tokens == theirs.tokens for mine, theirs in zip(plan.runs, plan.controls,
                                                                                   strict=True))}


def mean_calls(rounds: list[Counter[str]]) -> dict[str, float]:
    """Each function's calls in a plain round, on average over the counted rounds."""
    total: Counter[str] = Counter()
    for calls in rounds:
        total.update(calls)
    return {name: count / len(rounds) for name, count in total.most_common()}


def print_calls(report: dict[str, Any]) -> None:
    """A plain round inside each plan beside target-only's: its Python calls, its time outside the target's forward
    (the forward is the same call in both), and the calls that differ most."""
    print("| plan | Python calls a plain round (plan / target-only) | outside the forward ms (plan / target-only) "
          "| calls that differ (plan - target-only, a round) |")
    print("| --- | --- | --- | --- |")
    for row in report["plans"]:
        mine, theirs = row["calls"], row["target_only_calls"]
        differ = {name: mine.get(name, 0.0) - theirs.get(name, 0.0) for name in mine.keys() | theirs.keys()}
        top = sorted((item for item in differ.items() if abs(item[1]) >= 0.5), key=lambda item: -abs(item[1]))[:6]
        print(f"| {row['plan']} | {sum(mine.values()):.0f} / {sum(theirs.values()):.0f} "
              f"| {row['outside_forward_ms']:.3f} / {row['target_only_outside_forward_ms']:.3f} "
              f"| {', '.join(f'{name} {count:+.0f}' for name, count in top) or 'none'} |")


def print_table(report: dict[str, Any]) -> None:
    print(f"Gemma 3 270M, {report['requests']} held-out requests x {report['tokens']} tokens, K{report['k']}, "
          f"governor on, {report['threads']} threads, drafters: {report['drafters']}")
    print("| plan | decode tok/s (plan / target-only) | / target-only (median, worst) "
          "| plain round ms (plan / target-only) | worst request: tok/s, plain round ms (plan / target-only), load "
          "| speculative rounds | proposed | accepted | greedy identical |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in report["plans"]:
        w = row["worst_request"]
        print(f"| {row['plan']} | {row['tok_s']:.1f} / {row['target_only_tok_s']:.1f} "
              f"| {row['ratio_median']:.3f}x, {row['ratio_worst']:.3f}x "
              f"| {row['plain_round_ms']:.2f} / {row['target_only_round_ms']:.2f} "
              f"| {w['tok_s']:.1f} / {w['target_only_tok_s']:.1f}, {w['plain_round_ms']:.1f} / "
              f"{w['target_only_round_ms']:.1f}, {w['load'][0]:.1f}-{w['load'][1]:.1f} "
              f"| {row['speculative_rounds']} of {row['rounds']} | {row['proposed']} | {row['accepted']} "
              f"| {'yes' if row['identical'] else 'NO'} |")


if __name__ == "__main__":
    main()
