"""Distilled drafters on the real Gemma 3 270M: against target-only and n-gram, on held-out prompts, in one run.

    python bench/bench_drafter.py DIR [DIR ...] [--widths 7] [--widths-only] [--per-shape 4] [--tokens 64]
                                  [--threads 2] [--json out.json]

Each DIR is a `power drafter distill` output of another kind (its manifest names the target and the
drafter; distill.json the kind and FR). The prompts are the packaged held-out set
(`power/drafters/prompts/heldout.jsonl`: topics and code tasks that appear in no
training prompt), `--per-shape` each of prose, code and chat, and of the
non-repeating prose (`power/drafters/prompts/nonrepeating.jsonl`: continuations
with nothing for n-gram to copy).

Per prompt, in one process, the configurations run in turn (so load from other
processes lands on all alike): target-only at capacity 1; n-gram at K7; each drafter at KK/SK for every K of
`--widths` (capacity K + 1); and, without `--widths-only`, each drafter at K10/S6
(capacity 11; Gemma's attention-only trunk rewinds any
length, so S < K never replays and the replay counter says so) and at K7 under
the adaptive controller; n-gram chained in front of the
drafter at K7 (what the distilled manifest runs: n-gram proposes first, the
drafter when it has nothing); and, per `--p-min` gate, the drafter at K7 with
its drafts cut at the first one less probable than the gate, alone and behind
n-gram. Speculative runs keep the cost governor on, as a
deployment does (`--governor off`: every round speculative, the drafter's own rate). Reported per shape: decode tok/s
(prefill excluded), speedup over target-only, the drafter's acceptance per draft position
(conditional on reaching it: the decoder's per-position counters), mean accepted
length, the draft step's time, governor parks, the worth-it verdict from the
measured acceptance and this machine's verification cost
(`power.orchestrator.planning.worth_it.assess` with the measured time of a K + 1-row
forward over a one-row forward, both after a held-out prompt), and whether every
greedy stream is bit-identical to target-only.
"""

from __future__ import annotations

from power.threads import settle_wait_policy

settle_wait_policy()  # before torch loads: OpenMP reads its wait policy once, as torch loads it

import argparse
import functools
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from power.app.bench.harness import machine
from power.documents.arithmetic import ARITHMETICS, QUANTISED
from power.documents.receipt import acceptance_by_position, summed_positions
from power.drafters.export import CHAINED_NGRAM_DRAFT_MIN, CHAINED_NGRAM_MATCH
from power.drafters.prompt_sets import Prompt, load_prompts
from power.orchestrator.inputs.loading import load_manifest
from power.orchestrator.planning.worth_it import acceptance_of, assess
from power.runtime.decoder import Decoder, Generation
from power.runtime.gguf_weights import GGUFFile
from power.runtime.governor import GovernorConfig
from power.runtime.sampling import Sampler, SamplingParams
from power.runtime.scheduler import SchedulerConfig
from power.runtime.speculators import registry
from power.runtime.speculators.base import DraftContext, NGramWindow, Proposal, Speculator, SpeculatorRequest
from power.runtime.speculators.chain import ChainSpeculator
from power.runtime.speculators.ngram import NGramSpeculator
from power.runtime.tokenizer import Tokenizer
from power.runtime.trunks import load_trunk

SHAPES = ("prose", "code", "chat", "nonrepeating")  # the last: power/drafters/prompts/nonrepeating.jsonl
NGRAM = NGramWindow(CHAINED_NGRAM_MATCH, CHAINED_NGRAM_DRAFT_MIN, 7)  # the distilled profile's lookup


@dataclass
class Recorder(Speculator):
    """Wraps a speculator and times its proposals."""

    inner: Speculator
    propose_s: float = 0.0
    proposals: int = 0

    def __post_init__(self) -> None:
        self.name, self.taps, self.max_proposals = self.inner.name, self.inner.taps, self.inner.max_proposals
        self.member_count, self.window_rows = self.inner.member_count, self.inner.window_rows

    def begin(self, tokens: Sequence[int]) -> None:
        self.inner.begin(tokens)

    def propose(self, ctx: DraftContext) -> Proposal:
        started = time.perf_counter()
        proposal = self.inner.propose(ctx)
        self.propose_s += time.perf_counter() - started
        self.proposals += 1
        return proposal

    def commit(self, tokens: Sequence[int], hidden: dict[int, torch.Tensor], start: int) -> None:
        self.inner.commit(tokens, hidden, start)

    def reset(self) -> None:
        self.inner.reset()

    def checkpoint(self) -> Any:
        return self.inner.checkpoint()

    def restore(self, checkpoint: Any) -> None:
        self.inner.restore(checkpoint)


@dataclass
class Config:
    name: str
    decoder: Decoder
    recorder: Recorder | None
    k: int = 0
    runs: list[Generation] = field(default_factory=list)

    def rate(self) -> float:
        decoded = sum(len(g.tokens) - 1 for g in self.runs)
        return decoded / sum(g.stats.decode_s for g in self.runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("drafter_dirs", type=Path, nargs="+")
    parser.add_argument("--widths", default="7", type=lambda text: [int(x) for x in text.split(",")],
                        help="comma-separated K each drafter runs at (S = K)")
    parser.add_argument("--widths-only", action="store_true",
                        help="only those widths: no K10/S6, adaptive, chained or gated configurations")
    parser.add_argument("--per-shape", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--arithmetic", choices=ARITHMETICS, default=QUANTISED,
                        help="the target's arithmetic (a plan's default: quantised)")
    parser.add_argument("--governor", choices=("on", "off"), default="on",
                        help="the cost governor (on: as a deployment runs; off: the drafter's own rate, every round "
                             "speculative)")
    parser.add_argument("--p-min", default="0.5", type=lambda text: [float(x) for x in text.split(",") if x],
                        help="comma-separated confidence gates (spec_draft_p_min) to run the drafter at K7 with, alone "
                             "and behind n-gram ('' for none)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    report = run(args)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


@dataclass(frozen=True)
class Distilled:
    """One `power drafter distill` output: its target, drafter file and distill.json."""

    target: Path
    drafter: Path
    report: dict[str, Any]

    @classmethod
    def read(cls, directory: Path) -> Distilled:
        manifest = load_manifest(directory / "manifest.toml").model
        report = json.loads((directory / "distill.json").read_text())
        entry = next(d for d in manifest.drafters if d.kind == report["kind"])
        return cls(directory / manifest.target.path, directory / entry.path, report)


def run(args: argparse.Namespace) -> dict[str, Any]:
    distilled = {d.report["kind"]: d for d in map(Distilled.read, args.drafter_dirs)}
    if len(distilled) < len(args.drafter_dirs) or len({d.target.resolve() for d in distilled.values()}) > 1:
        raise SystemExit("bench_drafter: give one distill output per kind, all of one target")
    gguf = GGUFFile(next(iter(distilled.values())).target)
    tokenizer = Tokenizer.from_gguf(gguf)
    greedy = Sampler(SamplingParams())

    @functools.cache
    def trunk(capacity: int) -> Any:  # configurations of one capacity share a trunk: each generation starts afresh
        return load_trunk(gguf, n_ctx=1024, verify_capacity=capacity, arithmetic=args.arithmetic)

    def speculating(name: str, k: int, s: int, make: Any, adaptive: bool = False) -> Config:
        t = trunk(k + 1)
        recorder = Recorder(make(t))
        return Config(name, Decoder(t, greedy, recorder, SchedulerConfig(k=k, s=s, adaptive=adaptive),
                                    GovernorConfig() if args.governor == "on" else None), recorder, k)

    configs = [Config("target-only", Decoder(trunk(1), greedy), None),
               speculating("ngram K7", 7, 7, lambda _: NGramSpeculator(NGRAM))]
    for kind, made in distilled.items():
        def drafter(t: Any, p_min: float | None = None, kind: str = kind, made: Distilled = made) -> Speculator:
            return registry.create(kind, SpeculatorRequest(t, gguf, GGUFFile(made.drafter), p_min=p_min))

        configs += [speculating(f"{kind} K{k}/S{k}", k, k, drafter) for k in args.widths]
        if args.widths_only:
            continue
        configs += [speculating(f"{kind} K10/S6", 10, 6, drafter),
                    speculating(f"{kind} K7 adaptive", 7, 7, drafter, adaptive=True),
                    speculating(f"ngram -> {kind} K7", 7, 7,
                                lambda t, d=drafter: ChainSpeculator([NGramSpeculator(NGRAM), d(t)]))]
        for p_min in args.p_min:
            configs += [speculating(f"{kind} K7 p>={p_min:g}", 7, 7, lambda t, p=p_min, d=drafter: d(t, p)),
                        speculating(f"ngram -> {kind} K7 p>={p_min:g}", 7, 7,
                                    lambda t, p=p_min, d=drafter: ChainSpeculator([NGramSpeculator(NGRAM),
                                                                                    d(t, p)]))]
    prompts = load_prompts(which="heldout") + [Prompt("nonrepeating",
                                                      p.text) for p in load_prompts(which="nonrepeating")]
    context = tokenizer.encode(prompts[0].text)
    costs = {c.k + 1: verify_cost(trunk(c.k + 1), c.k + 1, context) for c in configs if c.recorder is not None}
    print("a verification pass costs, in one-row steps: "
          + ", ".join(f"{rows} rows {cost:.2f}" for rows, cost in costs.items()), flush=True)
    report: dict[str, Any] = {"drafters": {kind: d.report for kind, d in distilled.items()}, "machine": machine(),
                              "threads": args.threads,
                              "arithmetic": args.arithmetic, "tokens": args.tokens, "governor": args.governor,
                              "verify_cost": {str(rows): round(cost, 3) for rows, cost in costs.items()},
                              "shapes": {}}
    for shape in SHAPES:
        chosen = [p for p in prompts if p.shape == shape][: args.per_shape]
        fresh = [Config(c.name, c.decoder, _fresh(c.recorder), c.k) for c in configs]
        identical = True
        for prompt in chosen:
            ids = tokenizer.encode(prompt.text)
            for config in fresh:
                config.runs.append(config.decoder.generate(ids, args.tokens, tokenizer.stop_ids))
            identical &= all(c.runs[-1].tokens == fresh[0].runs[-1].tokens for c in fresh)
        report["shapes"][shape] = summarise(shape, fresh, identical, costs)
    return report


def verify_cost(trunk: Any, rows: int, context: list[int], repeats: int = 7) -> float:
    """A forward of `rows` rows over a forward of one, after `context` (the median of interleaved repeats)."""
    trunk.reset()
    trunk.prefill(context)
    length = trunk.position
    times: dict[int, list[float]] = {1: [], rows: []}
    for _ in range(repeats):
        for count in times:
            started = time.perf_counter()
            trunk.forward(context[:count])
            times[count].append(time.perf_counter() - started)
            trunk.rewind(length)
    return statistics.median(times[rows]) / statistics.median(times[1])


def _fresh(recorder: Recorder | None) -> Recorder | None:
    """The same speculator with its counters at zero (one set per shape)."""
    if recorder is None:
        return None
    recorder.propose_s, recorder.proposals = 0.0, 0
    return recorder


def _priced_as(speculator: Speculator) -> str:
    """The mode whose round cost the worth-it arithmetic charges: a chain's learned drafter (the n-gram lookup in
    front of it costs nothing)."""
    return speculator.members[-1].name if isinstance(speculator, ChainSpeculator) else speculator.name


def summarise(shape: str, configs: list[Config], identical: bool, costs: dict[int, float]) -> dict[str, Any]:
    base = configs[0]
    base_rate = base.rate()
    target_step = 1.0 / base_rate
    out: dict[str, Any] = {"prompts": len(base.runs), "identical_to_target_only": identical, "configs": {}}
    print(f"\n[{shape}] {len(base.runs)} held-out prompts; greedy identical to target-only: {identical}")
    for config in configs:
        rate = config.rate()
        entry: dict[str, Any] = {"decode_tok_s": round(rate, 2), "speedup": round(rate / base_rate, 3)}
        if config.recorder is not None:
            stats = [g.stats for g in config.runs]
            rounds = sum(s.speculative_rounds for s in stats)
            accepted = sum(s.accepted for s in stats)
            rec = config.recorder
            per_position = acceptance_by_position(summed_positions(s.position_reached for s in stats),
                                                  summed_positions(s.position_accepted for s in stats))
            mean_accepted = accepted / rounds if rounds else 0.0
            draft_step = rec.propose_s / rec.proposals if rec.proposals else 0.0
            p = acceptance_of(1.0 + mean_accepted, config.k) if rounds else 0.0
            verdict = assess(target_step, draft_step, config.k, base_rate, p_band=(p, p),
                             drafter=_priced_as(config.recorder.inner), verify_cost=costs[config.k + 1]).verdict
            entry |= {"acceptance_per_position": [round(x, 3) for x in per_position],
                      "mean_accepted_length": round(mean_accepted, 3), "draft_step_ms": round(draft_step * 1e3, 2),
                      "implied_p": round(p, 3), "worth_it": verdict,
                      "governor_parks": sum(s.governor_parks for s in stats),
                      "replays": sum(s.replays for s in stats), "clamps": sum(s.clamps for s in stats),
                      "fallbacks": sum(s.fallbacks for s in stats)}
        out["configs"][config.name] = entry
        print(f"  {config.name:<14} {entry['decode_tok_s']:7.2f} tok/s  x{entry['speedup']:.2f}"
              + (f"  mean accepted {entry['mean_accepted_length']:.2f}  per position "
                 f"{entry['acceptance_per_position']}  draft {entry['draft_step_ms']} ms  worth-it "
                 f"{entry['worth_it']}  parks {entry['governor_parks']}  replays {entry['replays']}  clamps "
                 f"{entry['clamps']}  fallbacks {entry['fallbacks']}" if config.recorder else ""), flush=True)
    return out


if __name__ == "__main__":
    main()
