"""Speculative decoding benchmark: the real Gemma 3 270M with the n-gram speculator, side by side with plain decoding.

    python bench/bench_speculative.py [--k 7] [--tokens 96] [--passes 2] [--threads 2] [--json out.json]

Two traffic shapes from `power.app.bench.traffic` (the same prompts `power bench` uses):
- `echo`: the answer quotes a passage of unique lines from the prompt - where n-gram
  lookup pays;
- `prose`: a free answer - where it finds little, and the cost governor must keep
  speculation from costing time.

Per shape, in one process, the configurations alternate pass by pass:
- plain B1: plain decoding at verification capacity 1 (the target-only control);
- plain B{K+1}: plain decoding at the speculative plan's fixed shape (what a parked
  speculator's plain rounds cost);
- ngram: n-gram speculation (orders from --ngram), K proposals, verification
  capacity K + 1, governor on.
Reported: decode tok/s (prefill excluded), the ratios, acceptance, mean accepted
length, governor parks, and whether the greedy streams are identical.
"""

from __future__ import annotations

from power.threads import settle_wait_policy

settle_wait_policy()  # before torch loads: OpenMP reads its wait policy once, as torch loads it

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from power.app.bench.traffic import build_shape
from power.runtime.decoder import Decoder, Generation
from power.runtime.gguf_weights import GGUFFile
from power.runtime.governor import CostGovernor
from power.runtime.sampling import Sampler, SamplingParams
from power.runtime.scheduler import SchedulerConfig
from power.runtime.speculators.base import NGramWindow
from power.runtime.speculators.ngram import NGramSpeculator
from power.runtime.tokenizer import Tokenizer
from power.runtime.trunks import load_trunk

REPO = Path(__file__).resolve().parents[1]
DEFAULT_GGUF = REPO / "models" / "gemma-3-270m-q4_k_m.gguf"


@dataclass
class Run:
    config: str
    generation: Generation

    @property
    def decode_tok_s(self) -> float:
        decoded = len(self.generation.tokens) - 1
        return decoded / self.generation.stats.decode_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    parser.add_argument("--k", type=int, default=7, help="proposals per round (K); capacity K + 1")
    parser.add_argument("--tokens", type=int, default=96, help="tokens generated per request")
    parser.add_argument("--passes", type=int, default=2, help="alternating passes per configuration")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--arithmetic", default="quantised", help="quantised | float32 (power.documents.arithmetic)")
    parser.add_argument("--shapes", default="echo,prose")
    parser.add_argument("--ngram", default="4,2", help="match length, shortest draft (profiles/ngram.toml: 4,2)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    gguf = GGUFFile(args.gguf)
    tokenizer = Tokenizer.from_gguf(gguf)
    capacity = args.k + 1
    match, draft_min = (int(n) for n in args.ngram.split(","))
    window = NGramWindow(match, draft_min, args.k)
    trunks = {
        "plain B1": load_trunk(gguf, n_ctx=1024, verify_capacity=1, arithmetic=args.arithmetic),
        f"plain B{capacity}": load_trunk(gguf, n_ctx=1024, verify_capacity=capacity, arithmetic=args.arithmetic),
    }
    greedy = Sampler(SamplingParams())
    report = {"gguf": str(args.gguf), "k": args.k, "ngram_window": [window.match, window.draft_min, window.draft_max],
              "tokens": args.tokens, "passes": args.passes,
              "threads": args.threads, "arithmetic": args.arithmetic, "torch": torch.__version__, "shapes": {}}
    for name in args.shapes.split(","):
        shape = build_shape(name, args.tokens)
        prompt = tokenizer.encode(shape.prompt)
        runs: list[Run] = []
        for _ in range(args.passes):
            for config, trunk in trunks.items():
                runs.append(Run(config, Decoder(trunk, greedy).generate(prompt, args.tokens, tokenizer.stop_ids)))
            speculative = Decoder(trunks[f"plain B{capacity}"], greedy, NGramSpeculator(window),
                                  SchedulerConfig(k=args.k, s=args.k), CostGovernor())
            runs.append(Run("ngram", speculative.generate(prompt, args.tokens, tokenizer.stop_ids)))
        report["shapes"][name] = _summarise(name, len(prompt), runs, capacity)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


def _summarise(shape: str, prompt_tokens: int, runs: list[Run], capacity: int) -> dict:
    by_config: dict[str, list[Run]] = {}
    for run in runs:
        by_config.setdefault(run.config, []).append(run)
    rate = {config: _median([r.decode_tok_s for r in rs]) for config, rs in by_config.items()}
    spec = by_config["ngram"]
    stats = [r.generation.stats for r in spec]
    tokens = {config: rs[0].generation.tokens for config, rs in by_config.items()}
    summary = {
        "prompt_tokens": prompt_tokens,
        "generated": len(tokens["ngram"]),
        "decode_tok_s": rate,
        "ngram_vs_plain_B1": rate["ngram"] / rate["plain B1"],
        f"ngram_vs_plain_B{capacity}": rate["ngram"] / rate[f"plain B{capacity}"],
        "acceptance": sum(s.accepted for s in stats) / max(1, sum(s.proposed for s in stats)),
        "mean_accepted_length": sum(s.accepted for s in stats) / max(1, sum(s.speculative_rounds for s in stats)),
        "rounds": [s.rounds for s in stats],
        "governor_parks": [s.governor_parks for s in stats],
        "identical_to_plain_B1": tokens["ngram"] == tokens["plain B1"],
        f"identical_to_plain_B{capacity}": tokens["ngram"] == tokens[f"plain B{capacity}"],
    }
    print(f"\n[{shape}] {prompt_tokens} prompt tokens, {summary['generated']} generated; decode "
          "tok/s (median of passes):")
    for config, value in rate.items():
        print(f"  {config:<12}{value:8.2f}")
    print(f"  ngram / plain B1 = {summary['ngram_vs_plain_B1']:.2f}x, ngram / plain B{capacity} = "
          f"{summary[f'ngram_vs_plain_B{capacity}']:.2f}x; acceptance {summary['acceptance']:.1%}, "
          f"mean accepted length {summary['mean_accepted_length']:.2f}, governor parks {summary['governor_parks']}, "
          f"greedy identical to B1/B{capacity}: {summary['identical_to_plain_B1']}/"
          f"{summary[f'identical_to_plain_B{capacity}']}", flush=True)
    return summary


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"\n(total {time.perf_counter() - started:.0f} s)")
