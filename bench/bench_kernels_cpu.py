"""CPU matrix products with GGUF weights kept in their blocks (power.kernels.cpu) beside the runtime's packed ones.

    python bench/bench_kernels_cpu.py [--gguf models/gemma-3-270m-q4_k_m.gguf] [--rows 1,2,4,8] [--threads 1,2]
                                      [--paths amx,avx512vnni,...] [--tensors token_embd.weight,...] [--no-float32]
                                      [--json out.json]

For each tensor of the model (default: every matrix shape of one Gemma 3 layer and the 262,144 x 640 LM head)
and each thread count and row count, the engines run interleaved, round-robin in short slices, so load from
other processes lands on all of them alike: `QuantMatrix` on each instruction path this CPU has, and the
runtime's float32 reference `Linear` (power/runtime/linear.py) of the exactly dequantised weights (left out with
`--no-float32`). Reports the median ms per call, the weight bytes one call reads divided by that time (GB/s), and
the ratio to float32 (else to the first path); the CPU model, its instruction paths and the load average are
printed with them. `--clock cpu` times with the
process's CPU time instead of the wall clock: on a loaded machine it leaves out the time spent waiting for a core,
and it is only meaningful at one thread.
"""

from __future__ import annotations

from power.threads import settle_wait_policy

settle_wait_policy()  # before torch loads: OpenMP reads its wait policy once, as torch loads it

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from power.kernels.cpu import QuantMatrix, available_paths
from power.kernels.dequant import dequantize_reference
from power.runtime.gguf_weights import GGUFFile
from power.runtime.linear import Float32Linear

LAYER = ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.0.attn_output.weight",
         "blk.0.ffn_gate.weight", "blk.0.ffn_down.weight")
HEAD = "token_embd.weight"
SLICE_SECONDS = 0.05
ROUNDS = 5


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return "unknown CPU"


def engines(model: GGUFFile, name: str, paths: list[str],
            float32: bool) -> dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], int]]:
    """name -> (call, weight bytes one call reads)."""
    info = model.info(name)
    shape = (info.shape[0], info.shape[1])
    raw = model.raw(name)
    found: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], int]] = {}
    for path in paths:
        matrix = QuantMatrix(info.qtype, raw, shape, path=path)
        found[f"gguf {info.qtype} {path}"] = (matrix, matrix.nbytes)
    if float32:
        linear = Float32Linear(dequantize_reference(info.qtype, raw, shape), 1)
        found["torch float32"] = (linear, linear.nbytes)
    return found


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def seconds_per_call(call: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                     clock: Callable[[], float]) -> float:
    calls, start = 0, clock()
    while clock() - start < SLICE_SECONDS or calls < 2:
        call(x)
        calls += 1
    return (clock() - start) / calls


def measure(found: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], int]], x: torch.Tensor,
            clock: Callable[[], float]) -> dict[str, float]:
    """Median seconds per call of each engine, interleaved round-robin."""
    for call, _ in found.values():
        call(x)
    samples: dict[str, list[float]] = {label: [] for label in found}
    for _ in range(ROUNDS):
        for label, (call, _) in found.items():
            samples[label].append(seconds_per_call(call, x, clock))
    return {label: statistics.median(values) for label, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", default="models/gemma-3-270m-q4_k_m.gguf")
    parser.add_argument("--rows", default="1,2,4,8")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--paths", default=",".join(available_paths()))
    parser.add_argument("--tensors", default=",".join((*LAYER, HEAD)))
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall")
    parser.add_argument("--no-float32", dest="float32", action="store_false", help="leave out torch float32")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    model = GGUFFile(args.gguf)
    paths = args.paths.split(",")
    print(f"CPU: {cpu_model()}; paths {', '.join(available_paths())}; load average {os.getloadavg()[0]:.1f}")
    results = []
    for name in args.tensors.split(","):
        found = engines(model, name, paths, args.float32)
        info = model.info(name)
        for threads in map(int, args.threads.split(",")):
            torch.set_num_threads(threads)
            for rows in map(int, args.rows.split(",")):
                x = torch.randn(rows, info.shape[1])
                timings = measure(found, x, CLOCKS[args.clock])
                baseline_label = "torch float32" if args.float32 else next(iter(timings))
                baseline = timings[baseline_label]
                print(f"\n{name} {info.qtype} {info.shape[0]}x{info.shape[1]}, {rows} rows, {threads} threads "
                      f"({args.clock} clock, load {os.getloadavg()[0]:.1f})")
                for label, seconds in timings.items():
                    nbytes = found[label][1]
                    print(f"  {label:<24} {seconds * 1e3:9.3f} ms  {nbytes / seconds / 1e9:6.1f} GB/s  "
                          f"{baseline / seconds:5.2f}x {baseline_label}")
                    results.append({"tensor": name, "qtype": info.qtype, "shape": list(info.shape), "rows": rows,
                                    "threads": threads, "engine": label, "ms": seconds * 1e3, "weight_bytes": nbytes,
                                    "clock": args.clock})
        del found
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_model(), "paths": list(available_paths()), "results": results},
                                        indent=1))


if __name__ == "__main__":
    main()
