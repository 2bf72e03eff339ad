"""Where one request's time goes in `power serve`, beside the same request run in process (as `power run` runs it).

    python bench/bench_serve_phases.py [--profile target-only|ngram] [--shape prose|echo] [--slots 8]
                                       [--tokens 64] [--runs 5] [--threads 2]

One plan (the bundled Gemma with `profile`, `slots` slots of 512 positions, as bench/bench_serve.py plans it),
one prompt (bench_serve.py's one-client prompt, or the echo shape), three ways in turns, run by run, so load from
other processes lands on all alike: the engine in this process (`Engine.generate`), and the same request to a
`power serve` of the plan over HTTP, plain JSON (as bench_serve.py sends it) and streamed. For each: the wall
time, the engine's own prefill and decode seconds (the receipt's: from taking a slot to the first token, and from
there to the last), and what lies outside them (HTTP, JSON, parsing and tokenizing, the hand-offs between the
event loop and the engine thread). A stream adds the time to its first text and the gaps between its chunks.
The same prompt each run: the server's slot and the in-process engine both reuse its prompt's whole prefill chunks
after the first run, as a client repeating a prompt gets.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_serve import REPO, Server, client_prompts, plan, power_server

from power.app.bench.traffic import build_shape
from power.app.live import free_port
from power.documents.plan import load_plan
from power.runtime.engine import Engine, EngineOptions
from power.runtime.workload import Workload


def in_process(engine: Engine, prompt: str, tokens: int) -> dict[str, float]:
    began = time.perf_counter()
    receipt = engine.generate(prompt, tokens)
    wall = time.perf_counter() - began
    return {"wall": wall, "prefill": receipt.prefill_s, "decode": receipt.decode_s,
            "tokens": len(receipt.token_ids)}


def plain(server: Server, prompt: str, tokens: int) -> dict[str, float]:
    began = time.perf_counter()
    response = server.client.post(f"{server.base}/v1/completions",
                                  json={"prompt": prompt, "max_tokens": tokens, "temperature": 0.0})
    wall = time.perf_counter() - began
    response.raise_for_status()
    receipt = response.json()["receipt"]
    return {"wall": wall, "prefill": receipt["prefill_s"], "decode": receipt["decode_s"],
            "tokens": len(receipt["token_ids"])}


def streamed(server: Server, prompt: str, tokens: int) -> dict[str, float]:
    arrivals: list[float] = []
    receipt: dict = {}
    began = time.perf_counter()
    with server.client.stream("POST", f"{server.base}/v1/completions",
                              json={"prompt": prompt, "max_tokens": tokens, "temperature": 0.0,
                                    "stream": True}) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event["choices"][0]["text"]:
                arrivals.append(time.perf_counter())
            receipt = event.get("receipt") or receipt
    wall = time.perf_counter() - began
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    return {"wall": wall, "prefill": receipt["prefill_s"], "decode": receipt["decode_s"],
            "tokens": len(receipt["token_ids"]), "first_text": arrivals[0] - began,
            "gap_median": statistics.median(gaps) if gaps else 0.0, "gap_max": max(gaps) if gaps else 0.0}


def report(samples: dict[str, list[dict[str, float]]]) -> str:
    lines = ["| path | wall ms | prefill ms | decode ms | outside ms | decode ms/token | first text ms | "
             "chunk gap ms (median, max) |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, runs in samples.items():
        def med(key: str, runs=runs) -> float:
            return statistics.median(r[key] for r in runs) * 1e3

        outside = statistics.median((r["wall"] - r["prefill"] - r["decode"]) for r in runs) * 1e3
        per_token = statistics.median(r["decode"] / max(1, r["tokens"] - 1) for r in runs) * 1e3
        stream = (f"{med('first_text'):.1f} | {med('gap_median'):.2f}, {med('gap_max'):.1f}"
                  if "first_text" in runs[0] else "- | -")
        lines.append(f"| {name} | {med('wall'):.1f} | {med('prefill'):.1f} | {med('decode'):.1f} | {outside:.1f} | "
                     f"{per_token:.2f} | {stream} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="target-only", choices=["target-only", "ngram"])
    parser.add_argument("--shape", default="prose", choices=["prose", "echo"])
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="power-bench-serve-phases-"))
    plan_path = plan(REPO / "profiles" / f"{args.profile}.toml", args.slots, 512 * args.slots, work)
    prompt = build_shape("echo", args.tokens).prompt if args.shape == "echo" else client_prompts(1)[0]
    engine = Engine(Workload.of_plan(load_plan(plan_path), plan_path), EngineOptions(threads=args.threads))
    server = power_server(plan_path, free_port(), args, work / "power.log")
    server.start()
    try:
        ways = {"in process (Engine.generate)": lambda: in_process(engine, prompt, args.tokens),
                "power serve, plain JSON": lambda: plain(server, prompt, args.tokens),
                "power serve, streamed": lambda: streamed(server, prompt, args.tokens)}
        for way in ways.values():  # warm up: kernels, the slot's prompt chunks, the governor's first verdicts
            way()
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in ways}
        for run in range(args.runs):
            order = list(ways.items()) if run % 2 == 0 else list(ways.items())[::-1]
            for name, way in order:
                samples[name].append(way())
        print(f"{args.profile} plan, {args.slots} slots, {args.shape} prompt, {args.tokens} tokens, "
              f"{args.threads} threads, median of {args.runs} runs in turns; "
              f"path {engine.trunk.instruction_path}", file=sys.stderr)
        print(report(samples))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
