"""Per-token overhead: a plain decode step with its matrix products, beside the same step with every product a no-op.

    python bench/bench_overhead.py [--gguf models/gemma-3-270m-q4_k_m.gguf] [--threads 1] [--config quantised:1]

The no-op products return a preallocated zero block of the right shape, so what
is left is everything around them: embeddings, norms, rope, the cache write,
attention, activations, conversions, and Python's dispatch of each op. Steps
alternate real / no-op (A B A B ...) so load from other processes lands on both.
The layers run op by op (`layer_kernels=False`): a layer run as one kernel call
(`power.kernels.cpu.layer`) holds its products itself, so they cannot be swapped;
`bench_runtime.py` measures that path.
"""

from __future__ import annotations

from power.threads import settle_wait_policy

settle_wait_policy()  # before torch loads: OpenMP reads its wait policy once, as torch loads it

import argparse
import statistics
import time
from pathlib import Path

import torch
from native import layer_matrices, with_layer_matrices

from power.runtime.gguf_weights import GGUFFile
from power.runtime.linear import Linear
from power.runtime.trunks import load_trunk

REPO = Path(__file__).resolve().parents[1]


class NoOp:
    """Stands in for a packed matrix: zeros of the product's shape, no arithmetic."""

    def __init__(self, linear: Linear) -> None:
        self.linear, self.out = linear, linear.shape[0]
        self.row_count_invariant = linear.row_count_invariant

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(x.shape[0], self.out)


def swap(trunk, noop: bool) -> None:
    """Replace every packed matrix of the layers and the head by a NoOp (or put the real ones back)."""
    for layer in trunk.layers:
        if noop:
            with_layer_matrices(layer, {name: NoOp(m) for name, m in layer_matrices(layer).items()})
        else:
            with_layer_matrices(layer, {name: m.linear for name, m in layer_matrices(layer, NoOp).items()})
    if noop and isinstance(trunk._output, Linear):
        trunk._output = NoOp(trunk._output)
    elif not noop and isinstance(trunk._output, NoOp):
        trunk._output = trunk._output.linear


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, default=REPO / "models" / "gemma-3-270m-q4_k_m.gguf")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--config", default="quantised:1", help="arithmetic:capacity (power.documents.arithmetic)")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    arithmetic, capacity = args.config.split(":")
    trunk = load_trunk(GGUFFile(args.gguf), n_ctx=512, verify_capacity=int(capacity), arithmetic=arithmetic,
                       layer_kernels=False)
    trunk.prefill(list(range(2, 34)))
    times: dict[bool, list[float]] = {False: [], True: []}
    for step in range(2 * args.steps):
        noop = bool(step % 2)
        swap(trunk, noop)
        position = trunk.position
        started = time.perf_counter()
        trunk.forward([100 + step % 50])
        times[noop].append(time.perf_counter() - started)
        trunk.rewind(position)
    swap(trunk, False)
    real, bare = statistics.median(times[False]) * 1e3, statistics.median(times[True]) * 1e3
    print(f"{args.gguf.name} {args.config}, {args.threads} threads: step {real:.2f} ms with products, "
          f"{bare:.2f} ms with every product a no-op: {bare / real:.0%} of a step is around the products")


if __name__ == "__main__":
    main()
