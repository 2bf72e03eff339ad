"""The exact greedy LM head against the full head: time per call at 1, 2 and 8 rows, its parts, and the candidates.

    python bench/bench_greedy_head.py [--gguf models/gemma-3-270m-q4_k_m.gguf] [--threads 2] [--exact-blocks 6]

Real hidden states: the normed final residual of every row of a few prompts
(Gemma 3 270M in the quantised arithmetic). The head is the runtime's: Gemma's
tied Q8_0 embedding multiplied by `QuantMatrix` (`QuantLinear`). The exact blocks
are calibrated on the first prompt's rows (`calibrated_blocks`) and every row is
timed. Per call, timed interleaved (A B C D A B C D ...) so that load from other
processes lands on all alike: the full head and its argmax (A), the greedy head
(B), its cheap pass alone (C), the full product of the head held once (D: what a
verification's rows or a sampled row multiply by once the greedy head is built),
and the bytes each reads; the argmaxes and D's logits are checked equal to A's on
every call. Reports the median and the best (min-of-N) times, and the
load average beside the figures.
"""

from __future__ import annotations

from power.threads import settle_wait_policy

settle_wait_policy()  # before torch loads: OpenMP reads its wait policy once, as torch loads it

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from power.kernels.cpu.greedy import calibrated_blocks
from power.runtime.gguf_weights import GGUFFile
from power.runtime.greedy_head import GreedyHead
from power.runtime.layers import rms_norm
from power.runtime.linear import QuantLinear
from power.runtime.tokenizer import Tokenizer
from power.runtime.trunks import load_trunk

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ("The capital of France is Paris, and the capital of Italy is Rome. The capital of Spain is Madrid, and",
           "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n",
           "Once upon a time there was a little girl named Lily. She loved to play in the garden with her dog",
           "Speculative decoding drafts a few tokens and the target verifies them in one pass, so that")


def hidden_rows(gguf: GGUFFile) -> tuple[QuantLinear, torch.Tensor, int]:
    """The head, the normed final rows of every prompt and how many of them the first prompt has."""
    trunk = load_trunk(gguf, n_ctx=256, verify_capacity=1, greedy_head=False)  # its Q8_0 head, to compare against
    tokenizer, layers, d = Tokenizer.from_gguf(gguf), trunk.config.n_layers, trunk.config.d_model
    finals = []
    for prompt in PROMPTS:
        trunk.reset()
        finals.append(trunk.prefill(tokenizer.encode(prompt), taps=[layers]).hidden[layers])
    arch = gguf.require("general.architecture")
    normed = rms_norm(torch.cat(finals), gguf.tensor("output_norm.weight", (d,), "cpu"),
                      float(gguf.require(f"{arch}.attention.layer_norm_rms_epsilon")))
    head = trunk.lm_head
    assert isinstance(head, QuantLinear)
    return head, normed, finals[0].shape[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, default=REPO / "models" / "gemma-3-270m-q4_k_m.gguf")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--exact-blocks", type=int, default=6,
                        help="blocks of 32 input channels the pass reads in full")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    head, rows, calibration = hidden_rows(GGUFFile(args.gguf))
    started = time.perf_counter()
    exact_blocks = calibrated_blocks(rows[:calibration], args.exact_blocks)
    greedy = GreedyHead(head, exact_blocks)
    vocab, width = head.shape
    blocks = width // 32
    pass_bytes = vocab * (19 * (blocks - args.exact_blocks) + 34 * args.exact_blocks)
    print(f"{args.gguf.name}: head {vocab} x {width}, {rows.shape[0]} real rows, {args.threads} threads, "
          f"exact blocks {exact_blocks} of {blocks}, built in {time.perf_counter() - started:.1f} s; "
          f"the full head reads {head.nbytes / 1e6:.0f} MB, the cheap pass {pass_bytes / 1e6:.0f} MB "
          f"(the head held once: {greedy.nbytes / 1e6:.0f} MB more than its Q8_0 tiles); load average "
          f"{os.getloadavg()[0]:.2f}")
    for n in (1, 2, 8):
        full_s, greedy_s, pass_s, held_s, sizes = [], [], [], [], []
        for begin in range(0, rows.shape[0] - n + 1, n):
            x = rows[begin:begin + n]
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                logits = head(x)
                expected = logits.argmax(dim=1)
                t1 = time.perf_counter()
                got = greedy.argmax(x)
                t2 = time.perf_counter()
                greedy.bounds(x)
                t3 = time.perf_counter()
                held = greedy.head(x)
                t4 = time.perf_counter()
                full_s.append(t1 - t0)
                greedy_s.append(t2 - t1)
                pass_s.append(t3 - t2)
                held_s.append(t4 - t3)
                assert torch.equal(got, expected), (begin, n)
                assert torch.equal(held, logits), (begin, n)
            sizes.extend(greedy.last_candidate_tiles)
        full, fast, cheap, once = (statistics.median(t) * 1e3 for t in (full_s, greedy_s, pass_s, held_s))
        best_full, best_fast, best_cheap = (min(t) * 1e3 for t in (full_s, greedy_s, pass_s))
        print(f"{n} rows: median / best ms: full Q8_0 head + argmax {full:6.2f} / {best_full:6.2f}, greedy head "
              f"{fast:6.2f} / {best_fast:6.2f} ({full / fast:.2f}x / {best_full / best_fast:.2f}x), cheap pass "
              f"{cheap:6.2f} / {best_cheap:6.2f}, full product of the head held once {once:6.2f} "
              f"(the Q8_0 head's product and argmax over it: {full / once:.2f}x); candidate tiles per row median "
              f"{statistics.median(sizes):.0f}, "
              f"mean {statistics.mean(sizes):.0f}, max {max(sizes)} of {vocab // 16}; "
              f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
