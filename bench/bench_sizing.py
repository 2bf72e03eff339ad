"""Sizing against the anchors' shortcuts, side by side in one run: Power's per-layer KV vs a naive estimate.

The naive column makes the shortcuts DESIGN.md names in the anchors: element 0 of
a per-layer `head_count_kv` array (gguf-parser), KV on every block of a hybrid
model (gguf-parser), and no sliding window for an architecture missing from a
hard-coded table. This script sizes the same headers both ways and prints the
ratio, for the factory's header-only Qwen3.6-27B target
(48 recurrent + 16 attention layers), the bundled Gemma 3 270M (15 sliding + 3
global layers) and a per-layer GQA header ([8, 2, 8, 2] kv heads).

    python bench/bench_sizing.py [--json]

Figures are bytes of target KV at the given contexts (f16); no timing is claimed.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from gguf import GGMLQuantizationType as Q

from power.artifacts.bundled import ensure_gemma
from power.artifacts.factory import build_qwen36_27b_q6k, write_sparse_gguf
from power.artifacts.facts import inspect_artifact
from power.orchestrator.sizing import Budget, Request, size_plan
from power.orchestrator.units import format_size

REPO = Path(__file__).resolve().parents[1]


def power_kv(facts, ctx: int) -> int:
    sizing = size_plan(facts, None, Request(ctx=ctx, verify_rows=1, snapshots=0, vocab=1), Budget(1, 0))
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


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = [("Qwen3.6-27B (hybrid)", build_qwen36_27b_q6k(Path(tmp)), (4096, 262_144)),
                 ("Gemma 3 270M (iSWA)", ensure_gemma(REPO / "models"), (4096, 32_768)),
                 ("per-layer GQA [2, 8, 2, 8]", gqa_header(Path(tmp)), (4096,))]
        for name, path, contexts in cases:
            facts = inspect_artifact(path)
            for ctx in contexts:
                ours, anchor = power_kv(facts, ctx), element_zero_every_block_kv(facts, ctx)
                rows.append({"model": name, "ctx": ctx, "power_kv_bytes": ours, "anchor_kv_bytes": anchor,
                             "anchor_over_power": round(anchor / ours, 3)})
    if "--json" in sys.argv:
        print(json.dumps(rows, indent=2))
        return
    for row in rows:
        print(f"{row['model']:<28} ctx {row['ctx']:>7,}  power {format_size(row['power_kv_bytes']):>11}  "
              f"naive {format_size(row['anchor_kv_bytes']):>11}  ratio {row['anchor_over_power']:.2f}")


if __name__ == "__main__":
    main()
