"""Which mix of an operator's corpus and the target's own text buys the most acceptance per minute.

    python bench/bench_corpus_mix.py --corpus PATH --work DIR [--data-minutes 5] [--shares 0,0.5,1]
                                     [--steps 240] [--heldout 8] [--fr 4096] [--threads 2] [--json out.json]

For each share, an MTP head is distilled as `power drafter distill --kind mtp
--corpus PATH --corpus-share SHARE` makes its rows: the corpus read at prefill
speed for SHARE of `--data-minutes`, the target continuing the packaged training
prompts for the rest. Every share gets the same data time and then the same
number of training steps, so the comparison is acceptance per minute of data.
Each head is measured after its last step on held-out prompts (the packaged
held-out set: topics and tasks no training prompt has), prose, code and chat,
continued by the target once and kept in DIR: acceptance per draft position and
mean accepted length at K=7, counted as verification counts it.

Also reported per share: the rows each source gave and in how long, and how
often the corpus's next token is the target's own choice there (only that text
trains the head's chain past its first draft).
"""

from __future__ import annotations

from power.threads import settle_wait_policy

settle_wait_policy()  # before torch loads: OpenMP reads its wait policy once, as torch loads it

import argparse
import hashlib
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from power.app.bench.harness import machine
from power.artifacts.contracts import MTP
from power.drafters import generate, prompt_sets, resume
from power.drafters.distill import DistillRequest, TrainingData, recipe, training_data, vocab_size
from power.drafters.generate import Example
from power.drafters.train import Trainer, training_precision
from power.drafters.vocabulary import ranked_tokens
from power.runtime.gguf_weights import GGUFFile
from power.runtime.tokenizer import Tokenizer
from power.runtime.trunks import load_trunk

K = 7
SHAPES = ("prose", "code", "chat")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, default=Path("models/gemma-3-270m-q4_k_m.gguf"))
    parser.add_argument("--corpus", type=Path, required=True, help="the operator's text (as `--corpus` reads it)")
    parser.add_argument("--work", type=Path, required=True, help="where each share's rows and the "
                                                                 "held-out rows are kept")
    parser.add_argument("--data-minutes", type=float, default=5.0, help="data time each share gets")
    parser.add_argument("--shares", default="0,0.5,1", help="the corpus's shares of the data time")
    parser.add_argument("--steps", type=int, default=240, help="training steps each share gets")
    parser.add_argument("--heldout", type=int, default=8, help="held-out prompts a shape")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--fr", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


def run(args: argparse.Namespace) -> dict[str, Any]:
    target = GGUFFile(args.target)
    taps = recipe(_request(args, 0.0), target).taps
    heldout = _heldout(args, target, taps)
    out: dict[str, Any] = {"machine": machine(), "corpus": str(args.corpus), "data_minutes": args.data_minutes,
                           "steps": args.steps, "shares": {}}
    for share in (float(s) for s in args.shares.split(",")):
        request = _request(args, share)
        work = args.work / f"share-{share:g}"
        data = training_data(request, target, taps, work, time.monotonic() + args.data_minutes * 60)
        row = {"data": data.report(), "corpus_agreement": _agreement(data.corpus),
               **_train(args, target, data, heldout)}
        out["shares"][f"{share:g}"] = row
        _print(share, row)
    return out


def _request(args: argparse.Namespace, share: float) -> DistillRequest:
    return DistillRequest(args.target, MTP, args.work, fr=args.fr, seed=args.seed, corpus=args.corpus,
                          corpus_share=share, max_new_tokens=args.max_new_tokens, slots=args.slots, progress=True)


def _train(args: argparse.Namespace, target: GGUFFile, data: TrainingData,
           heldout: dict[str, list[Example]]) -> dict[str, Any]:
    torch.manual_seed(args.seed)
    train, held = data.split()
    how = recipe(_request(args, 0.0), target)
    vocabulary = ranked_tokens(train, args.fr, vocab_size(target))
    longest = max(len(e.tokens) for e in train + [e for rows in heldout.values() for e in rows])
    objective = how.objective(target, vocabulary, longest, args.seed)
    settings = replace(how.settings(), seed=args.seed, max_steps=args.steps, precision=training_precision("auto"))
    trainer = Trainer(objective, settings, train, held, k=K)
    started = time.monotonic()
    trainer.run(None, None, progress=True)
    return {"train_s": round(time.monotonic() - started, 1), "precision": settings.precision,
            "held_back": trainer.curve().to_json(),
            "heldout": {shape: trainer.curve(rows).to_json() for shape, rows in heldout.items()}}


def _heldout(args: argparse.Namespace, target: GGUFFile, taps: tuple[int, ...]) -> dict[str, list[Example]]:
    """The target's own continuations of the first `--heldout` held-out prompts of each shape (made once)."""
    cached = args.work / f"heldout-{args.heldout}-{args.max_new_tokens}.pt"
    key = hashlib.sha256(json.dumps([str(args.target), taps, args.heldout, args.max_new_tokens]).encode()).hexdigest()
    width = int(target.require(f"{target.architecture}.embedding_length")) * len(taps)
    saved = resume.load(cached, key)
    if saved is not None:
        return {shape: [Example.from_plain(row, vocab_size(target), width) for row in rows]
                for shape, rows in saved.items()}
    tokenizer = Tokenizer.from_gguf(target)
    prompts = prompt_sets.load_prompts(which="heldout")
    chosen = {shape: [p for p in prompts if p.shape == shape][: args.heldout] for shape in SHAPES}
    longest = max(len(tokenizer.encode(p.text)) for rows in chosen.values() for p in rows)
    trunk = load_trunk(target, n_ctx=longest + args.max_new_tokens, verify_capacity=args.slots, slots=args.slots)
    rows = {shape: generate.self_generated(trunk, tokenizer, chosen[shape], taps, args.max_new_tokens)
            for shape in SHAPES}
    resume.save(cached, key, {shape: [e.plain() for e in examples] for shape, examples in rows.items()})
    return rows


def _agreement(corpus: list[Example]) -> float | None:
    """How often the corpus's next token is the target's greedy choice at that position."""
    pairs = [(e.labels[:-1], e.tokens[1:]) for e in corpus]
    total = sum(len(label) for label, _ in pairs)
    return round(sum(int((label == token).sum()) for label, token in pairs) / total, 3) if total else None


def _print(share: float, row: dict[str, Any]) -> None:
    data = row["data"]
    print(f"share {share:g}: corpus {data['corpus_tokens']} tokens in {data['corpus_s']} s "
          f"(agreement {row['corpus_agreement']}), generated {data['generated_tokens']} tokens in "
          f"{data['generated_s']} s, trained {row['train_s']} s")
    for where, curve in [("held_back", row["held_back"]), *row["heldout"].items()]:
        print(f"  {where:9s} mean@{K} {curve['mean_accepted'][str(K)]:.3f}  per position {curve['per_position']}")


if __name__ == "__main__":
    main()
