"""Select the held-out prose prompts whose greedy continuations leave an n-gram lookup little to copy.

    python bench/select_nonrepeating.py [--tokens 128] [--copyable 42] [--threads 2] [--json out.json]

Gemma 3 270M's greedy prose repeats itself within a few dozen tokens, and n-gram
lookup drafts those repeats exactly, so a prose shape where the target repeats
measures the lookup, not a learned drafter. This script has the bundled target
continue every candidate in `bench/data/prose_candidates.jsonl` (topics no
packaged training or held-out prompt has) greedily for `--tokens` tokens, as
`power run` decodes them (the default plan's KV cache type), counts in each
continuation the tokens the bundled lookup (a window of the last 4 tokens,
`ngram_match = 4`) could copy (the 5 tokens ending there occurred earlier in the
prompt or the continuation) and its longest repeat (the longest run, ending
inside the continuation, that occurred earlier), and writes the candidates with at
most `--copyable` copyable tokens to `power/drafters/prompts/nonrepeating.jsonl`,
each with both counts.
"""

from __future__ import annotations

from power.threads import settle_wait_policy

settle_wait_policy()  # before torch loads: OpenMP reads its wait policy once, as torch loads it

import argparse
import json
from pathlib import Path

import torch

from power.documents import kv_types
from power.drafters.export import CHAINED_NGRAM_MATCH as NGRAM_MATCH
from power.drafters.generate import self_generated
from power.drafters.prompt_sets import NONREPEATING_COPYABLE, copyable, load_prompts, longest_repeat
from power.runtime.gguf_weights import GGUFFile
from power.runtime.tokenizer import Tokenizer
from power.runtime.trunks import load_trunk

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"
CANDIDATES = ROOT / "bench" / "data" / "prose_candidates.jsonl"
SLOTS = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--copyable", type=int, default=NONREPEATING_COPYABLE)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="every candidate's continuation and longest repeat")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    candidates = load_prompts(CANDIDATES)
    gguf = GGUFFile(TARGET)
    tokenizer = Tokenizer.from_gguf(gguf)
    longest_prompt = max(len(tokenizer.encode(p.text)) for p in candidates)
    # the default plan's KV cache type: `power run` and `power bench` decode these tokens (the slots side by side
    # decode what each decodes alone)
    trunk = load_trunk(gguf, n_ctx=longest_prompt + args.tokens + 1, verify_capacity=SLOTS, slots=SLOTS,
                       kv_type=kv_types.DEFAULT)
    examples = self_generated(trunk, tokenizer, candidates, (0,), args.tokens)
    rows = []
    for prompt in candidates:
        ids = tokenizer.encode(prompt.text)
        example = next(e for e in examples if e.tokens[: len(ids)].tolist() == ids)
        text = ids + example.labels[len(ids) - 1 :].tolist()  # the prompt, then every token the target chose
        rows.append({"prompt": prompt.text, "longest_repeat": longest_repeat(text, len(ids)),
                     "copyable": copyable(text, len(ids), NGRAM_MATCH),
                     "continuation": tokenizer.decode(text[len(ids) :])})
    kept = [r for r in rows if r["copyable"] <= args.copyable]
    out = ROOT / "power" / "drafters" / "prompts" / "nonrepeating.jsonl"
    out.write_text("".join(json.dumps({"shape": "prose", "prompt": r["prompt"], "longest_repeat": r["longest_repeat"],
                                       "copyable": r["copyable"]}) + "\n" for r in kept), encoding="utf-8")
    print(f"{len(kept)} of {len(rows)} candidates leave a window-{NGRAM_MATCH} lookup at most "
          f"{args.copyable} tokens of {args.tokens} to copy; "
          f"(longest repeat, tokens a window-{NGRAM_MATCH} lookup could copy) per candidate: "
          f"{sorted((r['longest_repeat'], r['copyable']) for r in rows)}; wrote {out.relative_to(ROOT)}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
