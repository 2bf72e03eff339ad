"""One A/B run, four configurations side by side: llama-server and Power's runtime, each target-only and n-gram.

    python bench/ab_engines.py [--shapes prose,echo,identity] [--runs 2] [--max-tokens 32] [--threads 1]
                               [--prompt-tokens 1536] [--json out.json]

The plans are the bundled Gemma's `profiles/target-only.toml` and `profiles/ngram.toml`
(compiled here); llama-server runs each as `power render --target llama-server` prints it
(`power.app.live`), Power's runtime loads each in this process. Per shape the four
alternate run by run (`power.app.bench.harness.run_protocol`). Reported per shape: each
configuration's median decode tok/s, n-gram over target-only on each engine, Power over
llama-server for each plan, acceptance, and greedy parity within each engine. The figures
in docs/bench.md come from this script.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

from power.app.bench.harness import BenchConfig, run_protocol
from power.app.bench.traffic import SEEDS_PROMPT_TOKENS, build_shape, parse_shapes
from power.app.live import LiveEngine
from power.app.served import ServedEngine
from power.documents.plan import save_plan
from power.orchestrator.inputs.loading import load_manifest, load_profile
from power.orchestrator.inputs.schema import DeviceSpec, HostSpec
from power.orchestrator.planning.compile import compile_plan
from power.runtime.engine import Engine, EngineOptions
from power.runtime.workload import Workload

REPO = Path(__file__).resolve().parent.parent
PLANS = ("target-only", "ngram")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="prose,echo,identity")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=SEEDS_PROMPT_TOKENS)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    binary = subprocess.run([str(REPO / "scripts" / "build-llama-server")], capture_output=True, text=True,
                            check=True).stdout.strip().splitlines()[-1]
    folder = Path(tempfile.mkdtemp(prefix="power-ab-engines-"))
    host = HostSpec(name="bench", devices=[DeviceSpec(model="cpu", vram=16 << 30)])
    plans = {}
    for name in PLANS:
        plan, findings = compile_plan(load_manifest(REPO / "manifests" / "gemma3-270m.toml"),
                                      load_profile(REPO / "profiles" / f"{name}.toml"), host)
        assert plan is not None, [f.render() for f in findings]
        save_plan(plan, folder / f"{name}.plan.json")
        plans[name] = (plan, folder / f"{name}.plan.json")
    shapes = [build_shape(name, args.max_tokens, args.prompt_tokens) for name in parse_shapes(args.shapes)]
    with contextlib.ExitStack() as running:
        configs, servers = [], []
        for name, (plan, path) in plans.items():
            server = LiveEngine("llama-server", plan, path, Path(binary), threads=args.threads)
            running.callback(server.stop)
            server.start_process()
            servers.append(server)
            configs.append(BenchConfig(f"llama-server {name}", path, plan, ServedEngine(server)))
        for name, (plan, path) in plans.items():
            engine = Engine(Workload.of_plan(plan, path), EngineOptions(threads=args.threads))
            configs.append(BenchConfig(f"power {name}", path, plan, engine))
        for server in servers:
            server.wait_healthy()
        measurements = run_protocol(configs, shapes, args.runs, lambda line: print(line, flush=True))
    table = summarise(configs, shapes, measurements)
    print(markdown(table, args))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "shapes": table},
                                        indent=2) + "\n")


def summarise(configs, shapes, measurements) -> dict:
    table = {}
    for shape in shapes:
        row = {}
        for config in configs:
            receipts = [m.receipt for m in measurements if m.shape == shape.name and m.label == config.label]
            proposed = sum(r.proposed for r in receipts)
            row[config.label] = {
                "decode_tok_s": statistics.median(r.decode_tok_s for r in receipts),
                "acceptance": sum(r.accepted for r in receipts) / proposed if proposed else None,
                "prompt_tokens": receipts[0].prompt_tokens, "tokens": {r.tokens_sha256 for r in receipts},
            }
        for engine in ("llama-server", "power"):
            row[f"{engine} parity"] = row[f"{engine} ngram"]["tokens"] == row[f"{engine} target-only"]["tokens"]
        table[shape.name] = {label: ({k: v for k, v in value.items() if k != "tokens"} if isinstance(value, dict)
                                     else value) for label, value in row.items()}
    return table


def markdown(table: dict, args) -> str:
    def rate(cell: dict) -> str:
        return f"{cell['decode_tok_s']:.2f}"

    lines = [f"{args.runs} alternating runs, {args.max_tokens} tokens, {args.threads} thread(s) per engine; "
             "decode tok/s (median)", "",
             "| shape | prompt tokens | llama-server target-only | llama-server n-gram | Power target-only | "
             "Power n-gram | n-gram / target-only (llama-server) | n-gram / target-only (Power) | "
             "Power / llama-server (target-only) | Power / llama-server (n-gram) | acceptance (llama-server, Power) | "
             "greedy parity (llama-server, Power) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for shape, row in table.items():
        lt, ln, pt, pn = (row[f"{e} {p}"] for e in ("llama-server", "power") for p in PLANS)
        accept = ", ".join(f"{c['acceptance']:.0%}" if c["acceptance"] is not None else "-" for c in (ln, pn))
        parity = ", ".join("identical" if row[f"{e} parity"] else "DIFFERENT" for e in ("llama-server", "power"))
        lines.append(f"| {shape} | {lt['prompt_tokens']} | {rate(lt)} | {rate(ln)} | {rate(pt)} | {rate(pn)} | "
                     f"{ln['decode_tok_s'] / lt['decode_tok_s']:.2f}x | "
                     f"{pn['decode_tok_s'] / pt['decode_tok_s']:.2f}x | {pt['decode_tok_s'] / lt['decode_tok_s']:.2f}x "
                     f"| {pn['decode_tok_s'] / ln['decode_tok_s']:.2f}x | {accept} | {parity} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
