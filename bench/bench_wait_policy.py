"""How OpenMP's idle threads should wait: `power run` on the bundled Gemma under each wait policy, quiet and
beside busy processes, interleaved.

    python bench/bench_wait_policy.py [--busy 0,2] [--threads 2] [--repeats 3] [--json out.json]

Each policy is a fresh `power run --gguf ... --json` process (OpenMP reads its wait policy once, when torch
loads it), so every policy is set in the environment: libgomp's default spin (GOMP_SPINCOUNT=300000, what a
process gets without Power's choice), passive (OMP_WAIT_POLICY=passive: sleep at once), and bounded spins.
Within a run every policy goes once in turn, so load from other processes lands on all alike; the figures
are the receipts' prefill and decode tok/s, medians over the runs (a run past `--bound` seconds counts 0). Power's
choice (power.threads) is the policy that keeps both figures close to the best quiet and ahead under contention.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from native import contention, instruction_paths

REPO = Path(__file__).resolve().parents[1]
POWER = Path(sys.executable).parent / "power"
GGUF = REPO / "models" / "gemma-3-270m-q4_k_m.gguf"
PROMPT = ("Speculative decoding drafts a few tokens and the target verifies them in one pass. "
          "The capital of France is Paris, and the capital of Italy is Rome. ") * 3
POLICIES = {
    "libgomp default (spin 300000)": {"GOMP_SPINCOUNT": "300000"},
    "spin 100000": {"GOMP_SPINCOUNT": "100000"},
    "spin 10000": {"GOMP_SPINCOUNT": "10000"},
    "spin 1000": {"GOMP_SPINCOUNT": "1000"},
    "passive": {"OMP_WAIT_POLICY": "passive"},
}


def run_once(policy: dict[str, str], threads: int, tokens: int, bound_s: float) -> tuple[float, float]:
    """(prefill tok/s, decode tok/s) of one run; (0, 0) for a run that did not end within `bound_s`."""
    env = {name: value for name, value in os.environ.items() if name not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    try:
        done = subprocess.run([str(POWER), "run", "--gguf", str(GGUF), "--prompt", PROMPT, "--max-tokens",
                               str(tokens), "--threads", str(threads), "--json"], env=env | policy,
                              capture_output=True, text=True, timeout=bound_s, check=True)
    except subprocess.TimeoutExpired:
        return 0.0, 0.0
    receipt = json.loads(done.stdout)
    return receipt["prefill_tok_s"], receipt["decode_tok_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", default="0,2", help="busy processes beside the runs, comma-separated counts")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bound", type=float, default=600, help="seconds a run may take (0 tok/s beyond)")
    parser.add_argument("--policies", default=",".join(POLICIES), help="which policies, comma-separated")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    for key, value in instruction_paths(None).items():
        print(f"{key}: {value}")
    report: dict = {}
    for busy in [int(b) for b in args.busy.split(",")]:
        figures: dict[str, list[tuple[float, float]]] = {name: [] for name in args.policies.split(",")}
        with contention(busy):
            for _ in range(args.repeats):
                for name in figures:
                    figures[name].append(run_once(POLICIES[name], args.threads, args.tokens, args.bound))
        print(f"\n{busy} busy processes, {args.threads} threads, load average {os.getloadavg()[0]:.1f}, "
              f"median of {args.repeats}")
        print(f"{'policy':<32}{'prefill tok/s':>15}{'decode tok/s':>14}")
        report[str(busy)] = {}
        for name, runs in figures.items():
            prefill = statistics.median(run[0] for run in runs)
            decode = statistics.median(run[1] for run in runs)
            report[str(busy)][name] = {"prefill_tok_s": prefill, "decode_tok_s": decode, "runs": runs}
            print(f"{name:<32}{prefill:>15.1f}{decode:>14.1f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
