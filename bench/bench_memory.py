"""Resident memory of `power serve` stage by stage, beside llama-server, on the bundled Gemma 3 270M.

    python bench/bench_memory.py [--threads 2] [--tokens 16] [--json out.json]

Two measurements, each in a fresh process:

1. Stages, in one Python process that loads the target-only plan (ctx 4096, one slot) exactly as `power serve`
   does, through `power.runtime.engine.Engine`: the RSS (VmRSS) after Python starts, after `import torch`, after
   the runtime's imports, after the GGUF is read and verified, after the trunk's weights are built, after the
   tokenizer, after the engine is complete, and after a first request of `--tokens` greedy tokens.
   The stages inside the engine are timed by wrapping the functions the engine calls (`GGUFFile.verified`,
   `load_trunk`, `Tokenizer.from_gguf`), which still do their own work.
2. Servers: `power serve PLAN` and llama-server (`scripts/build-llama-server`, portable unless `--native`) with
   the line Power renders for the same plan; each one's RSS once it answers /health and after one completion
   request of `--tokens` tokens.
"""

from __future__ import annotations

from power.threads import settle_wait_policy

settle_wait_policy()  # before torch loads: OpenMP reads its wait policy once, as torch loads it

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from native import cpu_name, llama_server_binary, resident_mib

REPO = Path(__file__).resolve().parents[1]
POWER = Path(sys.executable).parent / "power"
PROMPT = "Once upon a time"


def stages(plan_path: Path, threads: int, tokens: int) -> dict[str, float]:
    """RSS after each loading stage, in this process (call it in a fresh one)."""
    rss = {"python": resident_mib()}
    import torch

    rss["import torch"] = resident_mib()
    from power.documents.plan import load_plan
    from power.runtime import engine as engine_module

    rss["import runtime"] = resident_mib()

    def after(label: str, function):
        def wrapped(*args, **kwargs):
            result = function(*args, **kwargs)
            rss[label] = resident_mib()
            return result
        return wrapped

    engine_module.GGUFFile.verified = after("GGUF read and verified", engine_module.GGUFFile.verified)
    engine_module.load_trunk = after("weights (trunk)", engine_module.load_trunk)
    engine_module.Tokenizer.from_gguf = after("tokenizer", engine_module.Tokenizer.from_gguf)
    torch.set_num_threads(threads)
    engine = engine_module.Engine(engine_module.Workload.of_plan(load_plan(plan_path), plan_path),
                                  engine_module.EngineOptions(device="cpu", threads=threads))
    rss["engine built"] = resident_mib()
    engine.generate(PROMPT, tokens)
    rss["first request"] = resident_mib()
    rss["weight_bytes MiB"] = engine.trunk.weight_bytes / 2**20
    return rss


def serve_rss(name: str, command: list[str], port: int, tokens: int) -> dict[str, float]:
    import httpx  # here: the stages' process measures Python before any library

    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{name} did not come up: {command}")
            time.sleep(0.5)
        up = resident_mib(process.pid)
        httpx.post(f"{base}/v1/completions", json={"prompt": PROMPT, "max_tokens": tokens, "temperature": 0.0},
                   timeout=600).raise_for_status()
        return {"up": up, "after one request": resident_mib(process.pid)}
    finally:
        process.terminate()
        process.wait(60)


def target_only_plan(directory: Path) -> Path:
    out = directory / "target-only.plan.json"
    subprocess.run([str(POWER), "plan", str(REPO / "manifests" / "gemma3-270m.toml"),
                    str(REPO / "profiles" / "target-only.toml"), "--device", "24 GiB", "-o", str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--native", action="store_true", help="llama-server built for this CPU (default: the "
                        "portable build; memory, not speed, is measured here)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--stages-of", type=Path, help=argparse.SUPPRESS)  # the child process of measurement 1
    args = parser.parse_args()
    if args.stages_of:
        print(json.dumps(stages(args.stages_of, args.threads, args.tokens)))
        return
    from power.app.live import LiveEngine, free_port
    from power.documents.plan import load_plan, located

    with tempfile.TemporaryDirectory() as work:
        plan_path = target_only_plan(Path(work))
        child = subprocess.run([sys.executable, __file__, "--stages-of", str(plan_path), "--threads",
                                str(args.threads), "--tokens", str(args.tokens)], check=True, capture_output=True,
                               text=True)
        result = {"cpu": cpu_name(), "stages": json.loads(child.stdout.splitlines()[-1]), "servers": {}}
        port = free_port()
        result["servers"]["power"] = serve_rss("power", [str(POWER), "serve", str(plan_path), "--port", str(port),
                                                         "--threads", str(args.threads)], port, args.tokens)
        binary = llama_server_binary(native=args.native)
        if binary:
            port = free_port()
            line = LiveEngine("llama-server", located(load_plan(plan_path), plan_path), plan_path, Path(binary),
                              threads=args.threads).argv(port)
            result["servers"]["llama-server"] = serve_rss("llama-server", line, port, args.tokens)
    print(f"CPU: {result['cpu']}\n\n| stage | RSS MiB |\n| --- | ---: |")
    for stage, mib in result["stages"].items():
        print(f"| {stage} | {mib:,.0f} |")
    print("\n| server | up | after one request |\n| --- | ---: | ---: |")
    for name, figures in result["servers"].items():
        print(f"| {name} | {figures['up']:,.0f} | {figures['after one request']:,.0f} |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
