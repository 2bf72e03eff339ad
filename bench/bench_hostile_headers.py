"""`power inspect` on hostile GGUF headers against the real Gemma header: wall time and peak memory, side by side.

    python bench/bench_hostile_headers.py [--json]

Each contender is a fresh `power inspect --no-hash` process (imports included), run in turn;
its peak resident memory comes from the kernel (`wait4`). The hostile headers:
- one uint8 metadata array filling a 250 MB header (a long numeric array: a memoryview, never listed);
- two million tensor infos (past the 65,536-tensor cap: refused before anything is built);
- 65,536 tensor infos (at the cap: read in full).
The claim: the hostile ones cost about what their header bytes weigh, and none is far from the real one.
"""

from __future__ import annotations

import argparse
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from power.artifacts.bundled import ensure_gemma

REPO = Path(__file__).resolve().parents[1]
POWER = str(Path(sys.executable).with_name("power"))


def _string(text: str) -> bytes:
    return struct.pack("<Q", len(text)) + text.encode()


def _architecture() -> bytes:
    return _string("general.architecture") + struct.pack("<I", 8) + _string("llama")


def one_array(path: Path, elements: int) -> Path:
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + _architecture()
    head += _string("llama.big") + struct.pack("<IIQ", 9, 0, elements)
    with open(path, "wb") as handle:
        handle.write(head)
        handle.truncate(len(head) + elements)
    return path


def many_tensors(path: Path, count: int) -> Path:
    """Written piece by piece: this process stays small, since a child's peak RSS counts what it forked from."""
    with open(path, "wb") as handle:
        handle.write(b"GGUF" + struct.pack("<IQQ", 3, count, 1) + _architecture())
        for first in range(0, count, 10_000):
            handle.write(b"".join(_string(f"t{i}") + struct.pack("<IQIQ", 1, 8, 0, 32 * i)
                                  for i in range(first, min(count, first + 10_000))))
        handle.write(b"\0" * (-handle.tell() % 32))
        handle.truncate(handle.tell() + 32 * count)
    return path


def inspect_once(path: Path, as_json: bool) -> tuple[float, int, int]:
    """(seconds, peak RSS in bytes, exit code) of one `power inspect --no-hash` process."""
    start = time.perf_counter()
    process = subprocess.Popen([POWER, "inspect", "--no-hash", *(["--json"] if as_json else []), str(path)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    return time.perf_counter() - start, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="Run `power inspect --json` (the metadata printed too).")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="power-bench-headers-") as directory:
        root = Path(directory)
        contenders = {
            "Gemma 3 270M (real, 262,144 tokens)": ensure_gemma(REPO / "models"),
            "one 250 MB uint8 array": one_array(root / "array.gguf", 250_000_000),
            "2,000,000 tensor infos": many_tensors(root / "tensors.gguf", 2_000_000),
            "65,536 tensor infos": many_tensors(root / "cap.gguf", 65_536),
        }
        results = {name: inspect_once(path, args.json) for name, path in contenders.items()}
    base_time, base_rss, _ = next(iter(results.values()))
    print(f"{'header':40} {'exit':>4} {'time':>9} {'ratio':>6} {'peak RSS':>10} {'ratio':>6}")
    for name, (seconds, rss, code) in results.items():
        print(f"{name:40} {code:>4} {seconds:>8.2f}s {seconds / base_time:>5.1f}x {rss / 2**20:>7.0f} MiB "
              f"{rss / base_rss:>5.1f}x")


if __name__ == "__main__":
    main()
