"""What a drafter that cannot win costs a plan: each kind and chain against target-only, in one run (issue 41).

    python bench/bench_parked.py [--per-shape 2] [--tokens 96] [--k 6] [--threads 2] [--mtp [LABEL=]FILE ...]
                                 [--json out.json]

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
its speculators' first ever (the step that measures each one); the worst ratio counts it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
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


class TimedDecoder(Decoder):
    """A decoder that keeps each round's wall time and whether it was plain (no speculator's pass)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rounds: list[tuple[bool, float]] = []

    def _account(self, decoding: Decoding, result: RoundResult, seconds: float) -> None:
        self.rounds.append((result.member is None, seconds))
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

    def request(self, control: TimedDecoder, ids: list[int], tokens: int, stop: Any) -> None:
        """One prompt: target-only's run, then this plan's, each round's time kept."""
        before = load_average()
        for decoder, runs, rounds in ((control, self.controls, self.control_round_s),
                                      (self.decoder, self.runs, self.plain_round_s)):
            decoder.rounds.clear()
            runs.append(decoder.generate(ids, tokens, stop))
            rounds.append([seconds for plain, seconds in decoder.rounds if plain])
        self.load.append((before, load_average()))


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
        return Plan(name, TimedDecoder(trunk, Sampler(SamplingParams()), speculator,
                                       SchedulerConfig(k=args.k, s=args.k), GovernorConfig()))

    control = TimedDecoder(trunk, Sampler(SamplingParams()))
    plans = [plan(name) for name in names]
    prompts = [
        p for shape in SHAPES for p in [p for p in load_prompts(which="heldout") if p.shape == shape][: args.per_shape]
    ]
    control.generate(tokenizer.encode(prompts[-1].text), 8)  # warm the trunk: the first request ran cold
    for prompt in prompts:
        for p in plans:
            p.request(control, tokenizer.encode(prompt.text), args.tokens, tokenizer.stop_ids)
    report = {"machine": machine(), "threads": args.threads, "tokens": args.tokens, "k": args.k,
              "drafters": {name: str(file.path) for name, file in drafters.items()} if args.mtp else "untrained",
              "requests": len(prompts), "shapes": [p.shape for p in prompts],
              "plans": [summary(p) for p in plans]}
    print_table(report)
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
            "identical": all(mine.tokens == theirs.tokens for mine, theirs in zip(plan.runs, plan.controls,
                                                                                   strict=True))}


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
