"""Inspection and hashing speed, side by side in one run, reported as ratios.

    python bench/bench_inspect.py [GGUF]       (default: the bundled Gemma 3 270M file)

1. `inspect_artifact` (header, facts, complete tokenizer fingerprint) and the `power
   inspect --json --no-hash` command (a fresh process: imports included) against
   `gguf.GGUFReader` opening the same file. Target: at least 50x.
2. `sha256_file(use_cache=False)` against hashlib's own `file_digest` over the same file.
   Target: at least 90% of its throughput.
Each contender runs `--repeat` times interleaved; the best time of each is compared.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gguf

from power.artifacts.bundled import ensure_gemma
from power.artifacts.digests import sha256_file
from power.artifacts.facts import inspect_artifact

REPO = Path(__file__).resolve().parents[1]


def best_time(action, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return min(times)


def power_cli(path: Path) -> None:
    subprocess.run([str(Path(sys.executable).with_name("power")), "inspect", "--json", "--no-hash", str(path)],
                   check=True, stdout=subprocess.DEVNULL)


def raw_hashlib(path: Path) -> None:
    with open(path, "rb") as handle:
        hashlib.file_digest(handle, "sha256")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", nargs="?", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    path = args.gguf or ensure_gemma(REPO / "models")
    os.environ["POWER_CACHE_DIR"] = tempfile.mkdtemp(prefix="power-bench-cache-")
    size = path.stat().st_size
    print(f"{path} ({size:,} B), best of {args.repeat}")

    reference = best_time(lambda: gguf.GGUFReader(path), args.repeat)
    ours = best_time(lambda: inspect_artifact(path), args.repeat)
    cli = best_time(lambda: power_cli(path), args.repeat)
    print(f"  gguf.GGUFReader(path)            {reference * 1000:9.1f} ms")
    print(f"  inspect_artifact(path)           {ours * 1000:9.1f} ms   {reference / ours:6.1f}x faster")
    print(f"  power inspect --json --no-hash   {cli * 1000:9.1f} ms   {reference / cli:6.1f}x faster (new process)")

    hashed, raw = [], []
    for _ in range(args.repeat):
        hashed.append(best_time(lambda: sha256_file(path, use_cache=False), 1))
        raw.append(best_time(lambda: raw_hashlib(path), 1))
    ours_rate, raw_rate = size / min(hashed) / 1e6, size / min(raw) / 1e6
    print(f"  hashlib.file_digest              {raw_rate:9.1f} MB/s")
    print(f"  sha256_file(use_cache=False)     {ours_rate:9.1f} MB/s   {100 * ours_rate / raw_rate:5.1f}% of hashlib")


if __name__ == "__main__":
    main()
