"""Drafter kinds and training choices side by side on one fixed data set, at a fixed number of steps.

    python bench/bench_distill.py --work DIR [--max-prompts 64] [--max-new-tokens 96] [--heldout 16]
                                  [--steps 80] [--configs mtp,mtp-l1,dflash] [--fr 4096] [--vocab ranked|prefix]
                                  [--json out.json]

The data is generated once (DIR/data.pt, reused while the same arguments made it):
the target continues the first `--max-prompts` packaged training prompts and the
first `--heldout` prose prompts of the packaged held-out set (topics no training
prompt has), keeping every tap any configuration reads. Each configuration then
trains as `power drafter distill` would (its recipe, objective and settings; every
tenth training sequence held back to pick the best checkpoint) for exactly
`--steps` steps, so the comparison is by steps, not wall time, and load on the
machine does not move it. Reported per configuration, for the best checkpoint
(by held-back acceptance, as the distillation exports it) and for the final
state: the held-back and the held-out prose acceptance curves (per draft
position, conditional on reaching it; mean accepted length at K=7). On a
loaded machine run it with `--threads 1`: two threads that wait on each other
while other processes hold the cores ran a step 17x slower here.

Configurations: `mtp` (the default MTP head: 3 chain levels, random start),
`mtp-l1` (one level: teacher forcing only), `mtp-l2`, `dflash`, `dflash2`, `dspark`, and each block kind's `-ce`
twin: its position-weighted cross-entropy alone, without the expected accepted drafts
(`power.drafters.model.expected_accepted`).
"""

from __future__ import annotations

from power.threads import settle_wait_policy

settle_wait_policy()  # before torch loads: OpenMP reads its wait policy once, as torch loads it

import argparse
import hashlib
import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from power.app.bench.harness import machine
from power.artifacts.contracts import DFLASH, DFLASH2, DSPARK, MTP
from power.drafters import generate, prompt_sets, resume
from power.drafters.distill import HELD_BACK_EVERY, HELD_BACK_MAX, DistillRequest, recipe, vocab_size
from power.drafters.generate import Example
from power.drafters.train import PRECISIONS, Trainer, training_precision
from power.drafters.vocabulary import coverage, ranked_tokens
from power.runtime.gguf_weights import GGUFFile
from power.runtime.tokenizer import Tokenizer
from power.runtime.trunks import load_trunk

CONFIGS: dict[str, dict[str, Any]] = {
    "mtp": {"kind": MTP, "chain_levels": 3},
    "mtp-l1": {"kind": MTP, "chain_levels": 1},
    "mtp-l2": {"kind": MTP, "chain_levels": 2},
    "dflash": {"kind": DFLASH},
    "dflash-ce": {"kind": DFLASH, "objective": {"acceptance_weight": 0.0}},
    "dflash2": {"kind": DFLASH2},
    "dflash2-ce": {"kind": DFLASH2, "objective": {"acceptance_weight": 0.0}},
    "dspark": {"kind": DSPARK},
    "dspark-ce": {"kind": DSPARK, "objective": {"acceptance_weight": 0.0}},
}
K = 7


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, default=Path("models/gemma-3-270m-q4_k_m.gguf"))
    parser.add_argument("--work", type=Path, required=True, help="where the generated data is kept")
    parser.add_argument("--max-prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--heldout", type=int, default=16, help="held-out prose prompts")
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--fr", type=int, default=16384, help="the draft vocabulary's size")
    parser.add_argument("--vocab", choices=("ranked", "prefix"), default="ranked",
                        help="the draft vocabulary: the most frequent training labels (what distill writes), or the "
                             "first --fr token IDs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=None, help="override the kind's learning rate")
    parser.add_argument("--eval-every", type=int, default=None, help="override the kind's evaluation interval")
    parser.add_argument("--configs", default="mtp,dflash")
    parser.add_argument("--precision", choices=PRECISIONS, default="auto", help="training's products")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    unknown = [c for c in args.configs.split(",") if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown configurations {unknown}; choose from {', '.join(CONFIGS)}")
    result = run(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


def run(args: argparse.Namespace) -> dict[str, Any]:
    target = GGUFFile(args.target)
    every = {name: recipe(_request(args, name), target) for name in CONFIGS}
    taps = tuple(sorted({tap for how in every.values() for tap in how.taps}))  # one data set serves them all
    recipes = {name: every[name] for name in args.configs.split(",")}
    train, heldout, data = _data(args, target, taps)
    width = int(target.require(f"{target.architecture}.embedding_length"))
    out: dict[str, Any] = {"machine": machine(), "data": data, "steps": args.steps, "lr": args.lr, "configs": {}}
    for name, how in recipes.items():
        torch.manual_seed(args.seed)
        mine = [_tapped(e, taps, how.taps, width) for e in train]
        held, fitted = mine[::HELD_BACK_EVERY][:HELD_BACK_MAX], [e for i, e in enumerate(mine) if i % HELD_BACK_EVERY]
        longest = max(len(e.tokens) for e in train + heldout)
        vocabulary = (ranked_tokens(fitted, args.fr, vocab_size(target)) if args.vocab == "ranked"
                      else torch.arange(min(args.fr, vocab_size(target))))
        objective = replace(how.objective(target, vocabulary, longest, args.seed), **CONFIGS[name].get("objective", {}))
        settings = replace(how.settings(), seed=args.seed, max_steps=args.steps,
                           precision=training_precision(args.precision))
        settings = replace(settings, learning_rate=args.lr) if args.lr else settings
        settings = replace(settings, eval_every=args.eval_every) if args.eval_every else settings
        trainer = Trainer(objective, settings, fitted, held, k=K)
        started = time.monotonic()
        best = trainer.run(None, None, progress=True)
        seconds = time.monotonic() - started
        prose = [_tapped(e, taps, how.taps, width) for e in heldout]
        final = {"held_back": trainer.curve().to_json(), "heldout_prose": trainer.curve(prose).to_json()}
        objective.net.load_state_dict(best["state"])
        out["configs"][name] = {"best_step": best["step"], "train_s": round(seconds, 1), "held_back": best["curve"],
                                "heldout_prose": trainer.curve(prose).to_json(), "final": final,
                                "settings": asdict(settings), "vocab": args.vocab,
                                "heldout_prose_coverage": round(coverage(heldout, vocabulary), 4),
                                "parameters": sum(p.numel() for p in objective.net.parameters())}
        _print(name, out["configs"][name])
    return out


def _request(args: argparse.Namespace, name: str) -> DistillRequest:
    fields = {key: value for key, value in CONFIGS[name].items() if key != "objective"}
    return DistillRequest(args.target, out=args.work, fr=args.fr, seed=args.seed, **fields)


def _data(args: argparse.Namespace, target: GGUFFile, taps: tuple[int, ...]) -> tuple[list[Example], list[Example],
                                                                                     dict[str, Any]]:
    key = hashlib.sha256(json.dumps([str(args.target), taps, args.max_prompts, args.max_new_tokens, args.heldout,
                                     args.seed]).encode()).hexdigest()
    cached = args.work / "data.pt"
    saved = resume.load(cached, key)
    if saved is not None:
        width = int(target.require(f"{target.architecture}.embedding_length")) * len(taps)
        train, heldout = ([Example.from_plain(row, vocab_size(target), width) for row in saved[part]]
                          for part in ("train", "heldout"))
        return train, heldout, saved["data"]
    tokenizer = Tokenizer.from_gguf(target)
    train_prompts = prompt_sets.load_prompts()[: args.max_prompts]
    prose = [p for p in prompt_sets.load_prompts(which="heldout") if p.shape == "prose"][: args.heldout]
    longest = max(len(tokenizer.encode(p.text)) for p in train_prompts + prose)
    trunk = load_trunk(target, n_ctx=longest + args.max_new_tokens, verify_capacity=args.slots, slots=args.slots)
    started = time.monotonic()
    train = generate.self_generated(trunk, tokenizer, train_prompts, taps, args.max_new_tokens)
    heldout = generate.self_generated(trunk, tokenizer, prose, taps, args.max_new_tokens)
    data = {"train_sequences": len(train), "train_tokens": generate.token_count(train),
            "labelled_rows": int(sum(int((e.labels >= 0).sum()) for e in train)),
            "heldout_sequences": len(heldout), "heldout_tokens": generate.token_count(heldout),
            "generate_s": round(time.monotonic() - started, 1)}
    resume.save(cached, key, {"train": [e.plain() for e in train], "heldout": [e.plain() for e in heldout],
                              "data": data})
    return train, heldout, data


def _tapped(example: Example, kept: tuple[int, ...], wanted: tuple[int, ...], width: int) -> Example:
    """The example with the features of `wanted` taps only, in order (the data keeps `kept`, side by side)."""
    columns = [example.features[:, kept.index(t) * width:(kept.index(t) + 1) * width] for t in wanted]
    return Example(example.tokens, example.labels, torch.cat(columns, dim=1))


def _print(name: str, row: dict[str, Any]) -> None:
    for state, curves in ((f"best (step {row['best_step']})", row), ("final", row["final"])):
        for where in ("held_back", "heldout_prose"):
            curve = curves[where]
            print(f"{name:9s} {state:16s} {where:13s} rounds {curve['blocks']:5d}  "
                  f"mean@{K} {curve['mean_accepted'][str(K)]:.3f}  per position {curve['per_position']}")


if __name__ == "__main__":
    main()
