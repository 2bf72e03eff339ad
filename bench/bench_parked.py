"""What a drafter that cannot win costs a plan: each kind and chain against target-only, in one run (issue 41).

    python bench/bench_parked.py [--per-shape 2] [--tokens 96] [--k 6] [--threads 2] [--mtp FILE] [--json out.json]

On the bundled Gemma 3 270M, an untrained drafter of each kind (`power.drafters.untrained`: the weights a
distillation starts from, whose drafts almost never land; `--mtp FILE` puts a distilled MTP sidecar in the head's
place) runs as a plan runs it: the cost governor on, K/S = `--k`, one decoder per plan kept across the requests (as
an engine keeps its slot's governor), every plan on the same trunk. Per held-out prompt (`--per-shape` each of
prose, code and chat) the plans run in turn, so load from other processes lands on all alike. Reported per plan:
the decode rate over target-only's (per request: the median and the worst), the median seconds of a plain round
inside the plan beside target-only's own, the speculative rounds, what they proposed and landed, and whether every
greedy stream is bit-identical to target-only. The first request of each plan is its speculators' first ever (the
step that measures each one); the worst ratio counts it.
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

from power.app.bench import machine
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
    plain_round_s: list[float] = field(default_factory=list)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-shape", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--k", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mtp", type=Path, help="a distilled MTP sidecar for the head (default: an untrained one)")
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
    drafters = {kind: GGUFFile(write_untrained(kind, GEMMA, work / f"{kind}.gguf")) for kind in ("dflash", "dspark")}
    drafters["mtp"] = GGUFFile(args.mtp or write_untrained("mtp", GEMMA, work / "mtp.gguf"))
    window = NGramWindow(CHAINED_NGRAM_MATCH, CHAINED_NGRAM_DRAFT_MIN, args.k)

    def member(kind: str) -> Speculator:
        return registry.create(kind, SpeculatorRequest(trunk, target=target, drafter=drafters.get(kind), ngram=window))

    def plan(name: str) -> Plan:
        kinds = name.split(" -> ")
        speculator = member(kinds[0]) if len(kinds) == 1 else ChainSpeculator([member(kind) for kind in kinds])
        return Plan(name, TimedDecoder(trunk, Sampler(SamplingParams()), speculator,
                                       SchedulerConfig(k=args.k, s=args.k), GovernorConfig()))

    plans = [Plan("target-only", TimedDecoder(trunk, Sampler(SamplingParams())))] + [plan(name) for name in PLANS]
    prompts = [
        p for shape in SHAPES for p in [p for p in load_prompts(which="heldout") if p.shape == shape][: args.per_shape]
    ]
    identical = {p.name: True for p in plans}
    plans[0].decoder.generate(tokenizer.encode(prompts[-1].text), 8)  # warm the trunk: the first request ran cold
    for prompt in prompts:
        ids = tokenizer.encode(prompt.text)
        for p in plans:
            p.decoder.rounds.clear()
            p.runs.append(p.decoder.generate(ids, args.tokens, tokenizer.stop_ids))
            p.plain_round_s += [seconds for plain, seconds in p.decoder.rounds if plain]
            identical[p.name] &= p.runs[-1].tokens == plans[0].runs[-1].tokens
    report = {"machine": machine(), "threads": args.threads, "tokens": args.tokens, "k": args.k,
              "mtp": str(args.mtp) if args.mtp else "untrained", "requests": len(prompts),
              "plans": [summary(p, plans[0], identical[p.name]) for p in plans]}
    print_table(report)
    return report


def rate(generation: Generation) -> float:
    return (len(generation.tokens) - 1) / generation.stats.decode_s


def summary(plan: Plan, control: Plan, identical: bool) -> dict[str, Any]:
    ratios = [rate(mine) / rate(theirs) for mine, theirs in zip(plan.runs, control.runs, strict=True)]
    stats = [g.stats for g in plan.runs]
    return {"plan": plan.name, "tok_s": statistics.median(rate(g) for g in plan.runs),
            "ratio_median": statistics.median(ratios), "ratio_worst": min(ratios), "ratios": ratios,
            "plain_round_ms": 1e3 * statistics.median(plan.plain_round_s),
            "target_only_round_ms": 1e3 * statistics.median(control.plain_round_s),
            "rounds": sum(s.rounds for s in stats), "speculative_rounds": sum(s.speculative_rounds for s in stats),
            "proposed": sum(s.proposed for s in stats), "accepted": sum(s.accepted for s in stats),
            "parks": sum(s.governor_parks for s in stats), "identical": identical}


def print_table(report: dict[str, Any]) -> None:
    print(f"Gemma 3 270M, {report['requests']} held-out requests x {report['tokens']} tokens, K{report['k']}, "
          f"governor on, {report['threads']} threads, MTP head: {report['mtp']}")
    print("| plan | decode tok/s | / target-only (median, worst) | plain round ms (plan / target-only) "
          "| speculative rounds | proposed | accepted | greedy identical |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in report["plans"]:
        print(f"| {row['plan']} | {row['tok_s']:.1f} | {row['ratio_median']:.3f}x, {row['ratio_worst']:.3f}x "
              f"| {row['plain_round_ms']:.2f} / {row['target_only_round_ms']:.2f} | {row['speculative_rounds']} of "
              f"{row['rounds']} | {row['proposed']} | {row['accepted']} | {'yes' if row['identical'] else 'NO'} |")


if __name__ == "__main__":
    main()
