"""Sizing against the real engine and against the anchors' shortcuts, from one run.

1. Power's plan against llama-server (`power.app.conformance`): every case of the matrix is
   launched on this machine (CPU build, debug log), its logged buffers are compared component by component with
   the plan Power compiles for the same settings. Error = (Power - llama-server) / llama-server; llama-server logs
   MiB with 2 decimals (the compute buffer at exit with 4), so a few KiB of difference is its rounding.
2. Target KV sized by Power and by a naive estimate with the anchors' shortcuts (element 0 of a per-layer
   `head_count_kv` array, KV on every block of a hybrid model, no sliding window), f16, llama-server's layout.

    python bench/bench_sizing.py [--llama-server PATH] [--markdown | --json]

The binary defaults to $POWER_LLAMA_SERVER, else what scripts/build-llama-server builds (cached per version).
Figures are bytes; no timing is claimed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

from gguf import GGMLQuantizationType as Q

from power.app import conformance
from power.artifacts.bundled import ensure_gemma
from power.artifacts.factory import build_qwen36_27b_q6k, write_sparse_gguf
from power.artifacts.facts import inspect_artifact
from power.orchestrator.engines.sizing import DeviceBudget, Request, size_plan
from power.orchestrator.inputs.units import format_size
from power.orchestrator.planning.compile import ArtifactMemo

REPO = Path(__file__).resolve().parents[1]


def llama_server(given: str | None) -> Path:
    if given or os.environ.get("POWER_LLAMA_SERVER"):
        return Path(given or os.environ["POWER_LLAMA_SERVER"])
    built = subprocess.run([str(REPO / "scripts" / "build-llama-server")], capture_output=True, text=True, check=True)
    return Path(built.stdout.strip().splitlines()[-1])


def conformance_rows(binary: Path, work: Path) -> list[conformance.Row]:
    models = conformance.models(work / "models", REPO / "models")
    memo = ArtifactMemo()
    rows = []
    for index, case in enumerate(conformance.MATRIX):
        plan = conformance.plan_for(case, models[case.model], work / f"case{index}", memo)
        log = conformance.run_llama_server(binary, plan, case, work / f"case{index}.log")
        rows += conformance.compare(case, plan, conformance.logged_buffers(log))
    return rows


def power_kv(facts, ctx: int) -> int:
    cpu = (DeviceBudget(0, "cpu", 1 << 50, 0, "cpu"),)
    sizing = size_plan("llama-server", facts, None, Request(ctx=ctx, vocab=1, flash_attn=True), cpu)
    return sum(c.bytes for c in sizing.components if c.name.startswith("target KV"))


def element_zero_every_block_kv(facts, ctx: int) -> int:
    """The shortcuts: every block, element 0's kv heads, the whole context."""
    kv_heads = facts.hparam("attention.head_count_kv")
    first = kv_heads[0] if isinstance(kv_heads, list) else kv_heads
    head_k = facts.hparam("attention.key_length")
    head_v = facts.hparam("attention.value_length", head_k)
    blocks = int(facts.hparam("block_count")) - int(facts.hparam("nextn_predict_layers", 0))
    return blocks * first * (head_k + head_v) * ctx * 2


def gqa_header(directory: Path) -> Path:
    metadata = {"llama.block_count": 4, "llama.embedding_length": 256, "llama.feed_forward_length": 512,
                "llama.attention.head_count": 8, "llama.attention.head_count_kv": [2, 8, 2, 8],
                "llama.attention.key_length": 32, "llama.context_length": 4096}
    tensors = {f"blk.{i}.attn_q.weight": ((256, 256), Q.F16) for i in range(4)}
    return write_sparse_gguf(directory / "gqa.gguf", "llama", metadata, tensors)


def anchor_rows(work: Path) -> list[dict]:
    rows = []
    cases = [("Qwen3.6-27B (hybrid)", build_qwen36_27b_q6k(work), (4096, 262_144)),
             ("Gemma 3 270M (iSWA)", ensure_gemma(REPO / "models"), (4096, 32_768)),
             ("per-layer GQA [2, 8, 2, 8]", gqa_header(work), (4096,))]
    for name, path, contexts in cases:
        facts = inspect_artifact(path)
        for ctx in contexts:
            ours, anchor = power_kv(facts, ctx), element_zero_every_block_kv(facts, ctx)
            rows.append({"model": name, "ctx": ctx, "power_kv_bytes": ours, "anchor_kv_bytes": anchor,
                         "anchor_over_power": round(anchor / ours, 3)})
    return rows


def markdown(rows: list[conformance.Row], anchors: list[dict]) -> str:
    lines = ["| case | component | basis | Power (B) | llama-server (B) | difference (B) | error |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for row in rows:
        lines.append(f"| {row.case} | {row.component} | {row.basis} | {row.power:,} | {row.llama:,} | "
                     f"{row.power - row.llama:+,} | {_error(row)} |")
    worst = max(rows, key=lambda row: abs(row.power - row.llama))
    lines += ["", f"{sum(r.ok for r in rows)} of {len(rows)} components within 2% or 1 MiB; largest difference "
                  f"{abs(worst.power - worst.llama):,} B ({worst.case}, {worst.component})", "",
              "| header | ctx | Power | naive | naive / Power |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {a['model']} | {a['ctx']:,} | {format_size(a['power_kv_bytes'])} | "
              f"{format_size(a['anchor_kv_bytes'])} | {a['anchor_over_power']:.2f} |" for a in anchors]
    return "\n".join(lines)


def _error(row: conformance.Row) -> str:
    return "logged as 0.00 MiB" if row.llama == 0 else f"{row.error:+.4%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-server", help="the llama-server binary (default: $POWER_LLAMA_SERVER or the build)")
    parser.add_argument("--markdown", action="store_true", help="print the tables as Markdown (docs/sizing.md)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rows = conformance_rows(llama_server(args.llama_server), work)
        anchors = anchor_rows(work)
    if args.json:
        print(json.dumps({"conformance": [{"case": r.case, "component": r.component, "basis": r.basis,
                                           "power_bytes": r.power, "llama_server_bytes": r.llama,
                                           "error": r.error, "within_tolerance": r.ok} for r in rows],
                          "anchors": anchors}, indent=2))
    elif args.markdown:
        print(markdown(rows, anchors))
    else:
        for row in rows:
            print(f"{row.case:<44} {row.component:<22} {row.basis:<9} {format_size(row.power):>11} "
                  f"{format_size(row.llama):>11}  {_error(row):>12}  {'ok' if row.ok else 'OFF'}")
        for a in anchors:
            print(f"{a['model']:<28} ctx {a['ctx']:>7,}  power {format_size(a['power_kv_bytes']):>11}  "
                  f"naive {format_size(a['anchor_kv_bytes']):>11}  ratio {a['anchor_over_power']:.2f}")


if __name__ == "__main__":
    main()
