"""The exact greedy LM head against the full head: time per call at 1, 2 and 8 rows, and the candidate-set sizes.

    python bench/bench_greedy_head.py [--gguf models/gemma-3-270m-q4_k_m.gguf] [--threads 2] [--channels 64]

Real hidden states: the normed final residual of every row of a few prompts
(Gemma 3 270M in the quantised arithmetic). The head is the runtime's: Gemma's
tied Q8_0 embedding multiplied by `QuantMatrix` (`QuantLinear`); the greedy head's float32 channels are chosen on the
first half of the rows and it is timed on the second half. The two are timed
interleaved (A B A B ...), so load from other processes lands on both alike; the
argmaxes are checked equal on every call.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from power.runtime.gguf_weights import GGUFFile
from power.runtime.greedy_head import GreedyHead, outlier_channels
from power.runtime.layers import rms_norm
from power.runtime.linear import QuantLinear
from power.runtime.tokenizer import Tokenizer
from power.runtime.trunks import load_trunk

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ("The capital of France is Paris, and the capital of Italy is Rome. The capital of Spain is Madrid, and",
           "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n",
           "Once upon a time there was a little girl named Lily. She loved to play in the garden with her dog",
           "Speculative decoding drafts a few tokens and the target verifies them in one pass, so that")


def hidden_rows(gguf: GGUFFile) -> tuple[QuantLinear, torch.Tensor]:
    trunk = load_trunk(gguf, n_ctx=256, verify_capacity=1)
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
    return head, normed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, default=REPO / "models" / "gemma-3-270m-q4_k_m.gguf")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--channels", type=int, default=64, help="input channels the cheap pass keeps in float32")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    head, rows = hidden_rows(GGUFFile(args.gguf))
    half = rows.shape[0] // 2
    started = time.perf_counter()
    greedy = GreedyHead(head, outlier_channels(rows[:half], args.channels))
    print(f"{args.gguf.name}: head {head.shape[0]} x {head.shape[1]}, {rows.shape[0]} real rows, "
          f"{args.threads} threads, {args.channels} float32 channels, built in {time.perf_counter() - started:.1f} s")
    held_out = rows[half:]
    for n in (1, 2, 8):
        full_s, greedy_s, sizes = [], [], []
        for begin in range(0, held_out.shape[0] - n + 1, n):
            x = held_out[begin:begin + n]
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                expected = head(x).argmax(dim=1)
                t1 = time.perf_counter()
                got = greedy.argmax(x)
                t2 = time.perf_counter()
                full_s.append(t1 - t0)
                greedy_s.append(t2 - t1)
                assert torch.equal(got, expected), (begin, n)
            sizes.extend(greedy.last_candidates)
        full, fast = statistics.median(full_s) * 1e3, statistics.median(greedy_s) * 1e3
        print(f"{n} rows: full Q8_0 head + argmax {full:6.2f} ms, greedy head {fast:6.2f} ms ({full / fast:.2f}x); "
              f"candidates per row median {statistics.median(sizes):.0f}, mean {statistics.mean(sizes):.0f}, "
              f"max {max(sizes)} of {head.shape[0]}")


if __name__ == "__main__":
    main()
