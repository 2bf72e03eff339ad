"""What a drafter that cannot win costs a plan: each kind and chain against target-only, in one run (issue 41).

    python bench/bench_parked.py [--per-shape 2] [--tokens 96] [--k 6] [--threads 2] [--drafter LABEL=FILE ...]
                                 [--plans mtp,dflash,...] [--calls] [--greedy-head on|off] [--json out.json]

On the bundled Gemma 3 270M, an untrained drafter of each kind (`power.drafters.untrained`: the weights a
distillation starts from, whose drafts almost never land) runs as a plan runs it: the cost governor on, K/S = `--k`,
one decoder per plan kept across the requests (as an engine keeps its slot's governor), every plan on the same trunk.
`--drafter LABEL=FILE` (repeatable) runs distilled drafters instead, the label's first word its kind (`mtp 71 steps`,
`dflash2 849 steps`, `dspark ...`): `LABEL` and `ngram -> LABEL` for each.
A last plan, `target-only (A/A)`, is target-only itself run against the same control: the same computation on
both sides, so its ratios are what the host's noise alone gives a plan that costs nothing, the yardstick for the
plans' intervals and worst requests.
Per held-out prompt (`--per-shape` each of prose, code, chat and list) each plan runs beside a
target-only run of the same prompt that is its control, in ABBA order (control first on one prompt, the plan first on
the next), both decoders in this one process on one trunk, so a plan and its control see the same load and neither is
always second; the load average is read around every pair. Reported per plan, over its requests:

- the decode rate over its control's: the median with a 95 % percentile bootstrap interval (the requests resampled),
  the worst request, and how many requests reached 0.98x;
- what a plain round inside the plan costs against its control's rounds (per request, the ratio of their median
  seconds: its median and interval), the same computation in both, so a ratio off 1.0 is the host's noise or upkeep
  riding on the plain rounds, and the plan's plain rounds after a plain and after a speculative round. With the
  greedy head (the default, as `power run`), a one-row round's cost depends on its row (the refine reads more tiles
  where the logits are close), and a chain's plain rounds are the rows its drafters could not predict, so their
  median runs above the control's every-row median; `--greedy-head off` takes the full head, whose cost is the same
  for every row;
- what the speculative rounds lost: each one's seconds beyond its tokens at the control's cost a token, summed over
  the requests as a share of the controls' decode time (the governor's budget is 1 % of a request's plain cost, half
  the 0.98x promise), and the worst request's share;
- the speculative rounds, what they proposed and landed, and whether every greedy stream is bit-identical to
  target-only's.

The first request of each plan is its speculators' first ever (the step that measures each one); the figures count
it. The JSON keeps every request's figures and load, the median time a plain round spends outside its target forward
(the forward is the same call in a plan and in target-only), and, with `--calls`, each plan's and target-only's
Python calls a plain round, counted over one more request each and printed as a second table with the calls that
differ most.
"""

from __future__ import annotations

from power.threads import settle_wait_policy

settle_wait_policy()  # before torch loads: OpenMP reads its wait policy once, as torch loads it

import argparse
import json
import random
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
SHAPES = ("prose", "code", "chat", "list")
PLANS = ("mtp", "dflash", "dspark", "ngram -> mtp", "ngram -> dspark")
SAME = "target-only (A/A)"  # a second target-only decoder against the control: the host's own spread


@dataclass
class Round:
    plain: bool  # no speculator's pass
    tokens: int  # emitted
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
        self.rounds.append(Round(result.member is None, len(result.emitted), seconds, self.forward_s, self._calls))
        super()._account(decoding, result, seconds)


@dataclass
class Run:
    """One decoder's run of one prompt: what it generated and its rounds."""

    generation: Generation
    rounds: list[Round]

    @property
    def rate(self) -> float:
        return (len(self.generation.tokens) - 1) / self.generation.stats.decode_s

    @property
    def plain(self) -> list[Round]:
        return [r for r in self.rounds if r.plain]


@dataclass
class Request:
    """One prompt through a plan and through its control (target-only), in the order `plan_first` says."""

    plan: Run
    control: Run
    plan_first: bool
    load: tuple[float, float]  # the 1-minute load average before and after the pair

    @property
    def ratio(self) -> float:
        return self.plan.rate / self.control.rate

    @property
    def token_s(self) -> float:
        """The control's seconds a token over its rounds: the plain cost the plan's rounds are measured against."""
        return sum(r.seconds for r in self.control.rounds) / sum(r.tokens for r in self.control.rounds)

    @property
    def plain_ratio(self) -> float | None:
        """A plain round inside the plan over one of the control's (their medians); None when every round of the
        plan's request was speculative (a chain whose lookup proposed throughout)."""
        plain = self.plan.plain
        if not plain:
            return None
        return statistics.median(r.seconds for r in plain) / statistics.median(r.seconds for r in self.control.rounds)

    @property
    def speculative_loss_s(self) -> float:
        """What the plan's speculative rounds cost beyond their tokens at the control's cost a token."""
        return sum(r.seconds - r.tokens * self.token_s for r in self.plan.rounds if not r.plain)

    @property
    def speculative_loss(self) -> float:
        """`speculative_loss_s` as a share of the control's decode time."""
        return self.speculative_loss_s / self.control.generation.stats.decode_s


@dataclass
class Plan:
    name: str
    decoder: TimedDecoder
    requests: list[Request] = field(default_factory=list)
    calls: list[Counter[str]] = field(default_factory=list)  # each counted plain round's Python calls
    control_calls: list[Counter[str]] = field(default_factory=list)

    def request(self, control: TimedDecoder, ids: list[int], tokens: int, stop: Any, plan_first: bool) -> None:
        """One prompt through target-only and this plan, in the order `plan_first` says, each round kept."""
        before = load_average()
        order = (self.decoder, control) if plan_first else (control, self.decoder)
        runs = {decoder: run_once(decoder, ids, tokens, stop) for decoder in order}
        self.requests.append(Request(runs[self.decoder], runs[control], plan_first, (before, load_average())))

    def count_calls(self, control: TimedDecoder, ids: list[int], tokens: int, stop: Any) -> None:
        """One prompt again, target-only then this plan, each round's Python calls counted (and not timed)."""
        for decoder, calls in ((control, self.control_calls), (self.decoder, self.calls)):
            decoder.rounds.clear()
            decoder.counting = True
            decoder.generate(ids, tokens, stop)
            decoder.counting = False
            calls.extend(r.calls for r in decoder.rounds if r.plain and r.calls is not None)


def run_once(decoder: TimedDecoder, ids: list[int], tokens: int, stop: Any) -> Run:
    decoder.rounds.clear()
    generation = decoder.generate(ids, tokens, stop)
    return Run(generation, list(decoder.rounds))


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


DRAFTER_KINDS = ("mtp", "dflash", "dflash2", "dspark")


def drafter_argument(value: str) -> tuple[str, Path]:
    """`LABEL=FILE`, the label's first word the drafter's kind."""
    label, _, path = value.rpartition("=")
    if not label or label.split()[0] not in DRAFTER_KINDS:
        raise argparse.ArgumentTypeError(f"{value!r}: write LABEL=FILE with the label's first word one of "
                                         f"{', '.join(DRAFTER_KINDS)}, e.g. \"mtp 71 steps=head.gguf\"")
    return label, Path(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-shape", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--k", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--drafter", type=drafter_argument, action="append", default=[],
                        help="LABEL=FILE: a distilled drafter whose kind is the label's first word, run alone and "
                             "behind n-gram (repeatable; default: the untrained drafters of every kind)")
    parser.add_argument("--plans", type=lambda value: value.split(","),
                        help="the plans to run, comma-separated (default: every one; names as the table prints them)")
    parser.add_argument("--calls", action="store_true",
                        help="also count the Python calls of each plan's plain rounds against target-only's, over "
                             "one more request a plan (sys.setprofile: those rounds are not timed)")
    parser.add_argument("--greedy-head", choices=("on", "off"), default="on",
                        help="the exact greedy LM head for one-row greedy forwards, as `power run` (default on); off: "
                             "the full head, whose cost does not depend on the row (the greedy head's refine costs "
                             "more on rows whose logits are close, which are the rows a chain's drafters failed on)")
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
    trunk = load_trunk(target, n_ctx=1024, verify_capacity=args.k + 1, greedy_head=args.greedy_head == "on")
    timing = TimedTrunk(trunk)
    if args.drafter:
        drafters = {label: GGUFFile(path) for label, path in args.drafter}
        names = [name for head in drafters for name in (head, f"ngram -> {head}")]
    else:
        drafters = {kind: GGUFFile(write_untrained(kind, GEMMA, work / f"{kind}.gguf"))
                    for kind in ("dflash", "dspark")}
        drafters["mtp"] = GGUFFile(write_untrained("mtp", GEMMA, work / "mtp.gguf"))
        names = list(PLANS)
    names.append(SAME)
    window = NGramWindow(CHAINED_NGRAM_MATCH, CHAINED_NGRAM_DRAFT_MIN, args.k)

    def member(name: str) -> Speculator:
        kind = name.split()[0]
        return registry.create(kind, SpeculatorRequest(trunk, target=target, drafter=drafters.get(name), ngram=window))

    def plan(name: str) -> Plan:
        if name == SAME:
            return Plan(name, TimedDecoder(timing, Sampler(SamplingParams())))
        members = name.split(" -> ")
        speculator = member(members[0]) if len(members) == 1 else ChainSpeculator([member(m) for m in members])
        return Plan(name, TimedDecoder(timing, Sampler(SamplingParams()), speculator,
                                       SchedulerConfig(k=args.k, s=args.k), GovernorConfig()))

    control = TimedDecoder(timing, Sampler(SamplingParams()))
    unknown = set(args.plans or ()) - set(names)
    if unknown:
        raise SystemExit(f"--plans names {', '.join(sorted(unknown))}; this run's plans are {', '.join(names)}")
    plans = [plan(name) for name in names if args.plans is None or name in args.plans]
    held_out = load_prompts(which="heldout")
    shapes = [[p for p in held_out if p.shape == shape][: args.per_shape] for shape in SHAPES]
    prompts = [group[i] for i in range(args.per_shape) for group in shapes if i < len(group)]  # the shapes in turn
    control.generate(tokenizer.encode(prompts[-1].text), 8)  # warm the trunk: the first request ran cold
    for index, prompt in enumerate(prompts):
        for p in plans:
            p.request(control, tokenizer.encode(prompt.text), args.tokens, tokenizer.stop_ids, index % 2 == 1)
    if args.calls:
        for p in plans:
            p.count_calls(control, tokenizer.encode(prompts[0].text), args.tokens, tokenizer.stop_ids)
    report = {"machine": machine(), "threads": args.threads, "tokens": args.tokens, "k": args.k,
              "lm_head": trunk.head_path,
              "drafters": {name: str(file.path) for name, file in drafters.items()} if args.drafter else "untrained",
              "requests": len(prompts), "shapes": [p.shape for p in prompts],
              "plans": [summary(p) for p in plans]}
    print_table(report)
    if args.calls:
        print_calls(report)
    return report


def interval(values: list[float], resamples: int = 2000) -> tuple[float, float]:
    """A 95 % percentile bootstrap interval of the median of `values` (the requests resampled with replacement)."""
    draw = random.Random(41)
    medians = sorted(statistics.median(draw.choices(values, k=len(values))) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def median_ms(seconds: list[float]) -> float | None:
    return 1e3 * statistics.median(seconds) if seconds else None


def plain_rounds_by_predecessor(requests: list[Request]) -> dict[str, float | None]:
    """The median plain round of the plan after a plain round and after a speculative one (ms): whether a plain
    round's cost rides on the round before it (a verification's rows, a drafter's pass)."""
    after: dict[bool, list[Round]] = {True: [], False: []}
    for request in requests:
        rounds = request.plan.rounds
        for before, round_ in zip(rounds, rounds[1:], strict=False):
            if round_.plain:
                after[before.plain].append(round_)
    return {"plain_after_plain_ms": median_ms([r.seconds for r in after[True]]),
            "plain_after_speculative_ms": median_ms([r.seconds for r in after[False]]),
            "plain_after_plain_forward_ms": median_ms([r.forward_s for r in after[True]]),
            "plain_after_speculative_forward_ms": median_ms([r.forward_s for r in after[False]]),
            "plain_after_speculative_rounds": len(after[False])}


def summary(plan: Plan) -> dict[str, Any]:
    requests = plan.requests
    ratios = [r.ratio for r in requests]
    plain_ratios = [ratio for ratio in (r.plain_ratio for r in requests) if ratio is not None]
    worst = requests[ratios.index(min(ratios))]
    stats = [r.plan.generation.stats for r in requests]
    control_s = sum(r.control.generation.stats.decode_s for r in requests)
    plain = [round_ for r in requests for round_ in r.plan.plain]
    control_rounds = [round_ for r in requests for round_ in r.control.rounds]
    return {"plan": plan.name, "requests": len(requests),
            "tok_s": statistics.median(r.plan.rate for r in requests),
            "target_only_tok_s": statistics.median(r.control.rate for r in requests),
            "ratio_median": statistics.median(ratios), "ratio_interval": interval(ratios),
            "ratio_worst": worst.ratio, "at_least_0_98": sum(ratio >= 0.98 for ratio in ratios),
            "plain_ratio_median": statistics.median(plain_ratios) if plain_ratios else None,
            "plain_ratio_interval": interval(plain_ratios) if plain_ratios else None,
            "plain_round_ms": median_ms([r.seconds for r in plain]),
            "target_only_round_ms": median_ms([r.seconds for r in control_rounds]),
            **plain_rounds_by_predecessor(requests),
            "speculative_loss": sum(r.speculative_loss_s for r in requests) / control_s,
            "speculative_loss_worst": max(r.speculative_loss for r in requests),
            "worst_request": {"index": requests.index(worst), "ratio": worst.ratio, "plain_ratio": worst.plain_ratio,
                              "speculative_loss": worst.speculative_loss,
                              "speculative_rounds": worst.plan.generation.stats.speculative_rounds,
                              "load": worst.load},
            "per_request": [{"ratio": r.ratio, "plain_ratio": r.plain_ratio, "speculative_loss": r.speculative_loss,
                             "plan_first": r.plan_first, "load": r.load} for r in requests],
            "rounds": sum(s.rounds for s in stats), "speculative_rounds": sum(s.speculative_rounds for s in stats),
            "proposed": sum(s.proposed for s in stats), "accepted": sum(s.accepted for s in stats),
            "parks": sum(s.governor_parks for s in stats),
            "outside_forward_ms": median_ms([r.seconds - r.forward_s for r in plain]),
            "target_only_outside_forward_ms": median_ms([r.seconds - r.forward_s for r in control_rounds]),
            **({"calls": mean_calls(plan.calls), "target_only_calls": mean_calls(plan.control_calls)}
               if plan.calls and plan.control_calls else {}),
            "identical": all(r.plan.generation.tokens == r.control.generation.tokens for r in requests)}


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
        if "calls" not in row:
            print(f"| {row['plan']} | no plain round in the counted request | | |")
            continue
        mine, theirs = row["calls"], row["target_only_calls"]
        differ = {name: mine.get(name, 0.0) - theirs.get(name, 0.0) for name in mine.keys() | theirs.keys()}
        top = sorted((item for item in differ.items() if abs(item[1]) >= 0.5), key=lambda item: -abs(item[1]))[:6]
        print(f"| {row['plan']} | {sum(mine.values()):.0f} / {sum(theirs.values()):.0f} "
              f"| {ms_cell(row['outside_forward_ms'])} / {ms_cell(row['target_only_outside_forward_ms'])} "
              f"| {', '.join(f'{name} {count:+.0f}' for name, count in top) or 'none'} |")


def ms_cell(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.3f}"


def ratio_cell(ratio: float | None) -> str:
    return "no plain round" if ratio is None else f"{ratio:.3f}"


def plain_cell(row: dict[str, Any]) -> str:
    """The plan's plain round over the control's, with its interval and the medians in ms, and the plan's plain round
    after a plain and after a speculative round."""
    if row["plain_ratio_median"] is None:
        return "no plain round"
    low, high = row["plain_ratio_interval"]
    after = (f"; after plain / speculative {row['plain_after_plain_ms']:.2f} / {row['plain_after_speculative_ms']:.2f}"
             if row["plain_after_speculative_ms"] is not None and row["plain_after_plain_ms"] is not None else "")
    return (f"{row['plain_ratio_median']:.3f} [{low:.3f}-{high:.3f}] "
            f"({row['plain_round_ms']:.2f} / {row['target_only_round_ms']:.2f}{after})")


def print_table(report: dict[str, Any]) -> None:
    print(f"Gemma 3 270M, {report['requests']} held-out requests x {report['tokens']} tokens, each beside its "
          f"target-only control in ABBA order, K{report['k']}, governor on, {report['threads']} threads, "
          f"drafters: {report['drafters']}, LM head: {report['lm_head']}")
    print("| plan | / target-only: median [95 % interval], worst | requests >= 0.98x "
          "| plain round / target-only's: median [95 % interval] (ms; the plan's after a plain / a speculative round) "
          "| speculative rounds' loss, of target-only's time: all, worst request "
          "| worst request: plain round / target-only's, load "
          "| speculative rounds | proposed | accepted | greedy identical |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in report["plans"]:
        w = row["worst_request"]
        low, high = row["ratio_interval"]
        print(f"| {row['plan']} | {row['ratio_median']:.3f}x [{low:.3f}-{high:.3f}], {row['ratio_worst']:.3f}x "
              f"| {row['at_least_0_98']} of {row['requests']} | {plain_cell(row)} "
              f"| {100 * row['speculative_loss']:.2f} %, {100 * row['speculative_loss_worst']:.2f} % "
              f"| {ratio_cell(w['plain_ratio'])}, {w['load'][0]:.1f}-{w['load'][1]:.1f} "
              f"| {row['speculative_rounds']} of {row['rounds']} | {row['proposed']} | {row['accepted']} "
              f"| {'yes' if row['identical'] else 'NO'} |")


if __name__ == "__main__":
    main()
