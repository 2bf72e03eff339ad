"""The device check: CUDA exactness of the kernels and the trunk, and a decode bench, in one run, figures to one JSON file.

    python bench/gpu_check.py [--device cuda] [--out gpu-check.json]     (scripts/gpu-check wraps it)

Meant for the first session lent a GPU: nothing to set up, nothing reaches the
network, every part is timed and bounded, and a failing part is recorded and the
rest still run. `--device cpu` runs the same checks through Triton's interpreter
(a dry run of the script itself; slow, so use it with --quick).

Checks, on the bundled Gemma 3 270M:
- dequantisation on the device (Triton) bit-exact against the CPU references, for
  every quantised tensor type of layer 0 and the token embedding;
- `qmatmul` on the device: row-count invariance (rows 1..8 alone equal to the same
  rows of an 8-row call, bit for bit) and closeness to the reference product;
- `greedy_verify` and `fr_argmax` on the device equal to their references, with ties;
- the trunk on the device: each row of a multi-row forward bit-identical to the
  same token run alone after the same prefix (the fixed-shape contract);
- a plain greedy decode: prefill and decode tok/s.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

from power.kernels import dispatch
from power.kernels.dequant import TRITON_TYPES, dequantize_reference
from power.runtime.gguf_weights import GGUFFile
from power.runtime.trunks import load_trunk

REPO = Path(__file__).resolve().parents[1]
GEMMA = REPO / "models" / "gemma-3-270m-q4_k_m.gguf"


def part(results: dict, name: str, body: Callable[[], dict[str, Any]]) -> None:
    started = time.perf_counter()
    try:
        results[name] = {"ok": True, **body()}
    except Exception as error:  # a failing part is a finding; the others still run
        results[name] = {"ok": False, "error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()[-3000:]}
    results[name]["seconds"] = round(time.perf_counter() - started, 2)
    print(f"{name}: {'ok' if results[name]['ok'] else 'FAILED ' + results[name]['error']} "
          f"({results[name]['seconds']} s)", flush=True)


def quantised_tensors(gguf: GGUFFile, rows: int) -> dict[str, tuple[str, torch.Tensor, tuple[int, int]]]:
    """One tensor of each quantised type among layer 0 and the embedding: name -> (qtype, raw rows, shape)."""
    chosen: dict[str, tuple[str, torch.Tensor, tuple[int, int]]] = {}
    for name, info in gguf.tensors.items():
        if not (name.startswith("blk.0.") or name == "token_embd.weight") or len(info.shape) != 2:
            continue
        if info.qtype in TRITON_TYPES and info.qtype not in {q for q, _, _ in chosen.values()}:
            out, inner = info.shape
            raw = gguf.raw(name).reshape(out, -1)[:rows].contiguous()
            chosen[name] = (info.qtype, raw, (min(rows, out), inner))
    return chosen


def check_dequant(gguf: GGUFFile, device: str, rows: int) -> dict[str, Any]:
    checked = {}
    for name, (qtype, raw, shape) in quantised_tensors(gguf, rows).items():
        got = dispatch.dequantize(qtype, raw.reshape(-1), shape, device=device).cpu()
        checked[name] = {"qtype": qtype, "bit_exact": bool(torch.equal(got, dequantize_reference(qtype, raw.reshape(-1), shape)))}
    assert all(c["bit_exact"] for c in checked.values()), checked
    return {"tensors": checked}


def check_qmatmul(gguf: GGUFFile, device: str, rows: int) -> dict[str, Any]:
    checked = {}
    for name, (qtype, raw, shape) in quantised_tensors(gguf, rows).items():
        weight = raw.to(device)
        x = torch.randn(8, shape[1], generator=torch.Generator().manual_seed(0)).to(device)
        together = dispatch.qmatmul(x, weight, qtype)
        invariant = all(torch.equal(dispatch.qmatmul(x[:m].contiguous(), weight, qtype), together[:m]) for m in range(1, 9))
        reference = dispatch.qmatmul(x.cpu(), raw, qtype)
        checked[name] = {"qtype": qtype, "row_count_invariant": invariant,
                         "max_abs_diff_vs_reference": float((together.cpu() - reference).abs().max())}
    assert all(c["row_count_invariant"] for c in checked.values()), checked
    return {"tensors": checked}


def check_argmax_kernels(device: str) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(8, 262144, generator=generator)
    logits[3, 100] = logits[3, 200] = logits[3].max() + 1  # a tie: the lowest index must win
    proposals = logits.argmax(dim=1)[:7].clone()
    proposals[5] += 1
    got = [int(v) for v in dispatch.greedy_verify(logits.to(device), proposals.to(device))]
    want = [int(v) for v in dispatch.greedy_verify(logits, proposals)]
    hidden, head = torch.randn(5, 640, generator=generator), torch.randn(4096, 640, generator=generator)
    fr_got = dispatch.fr_argmax(hidden.to(device), head.to(device), 3000).cpu()
    fr_want = dispatch.fr_argmax(hidden, head, 3000)
    assert got == want and torch.equal(fr_got, fr_want), (got, want, fr_got, fr_want)
    return {"greedy_verify": got, "fr_argmax_equal": True}


def check_trunk(gguf: GGUFFile, device: str) -> dict[str, Any]:
    trunk = load_trunk(gguf, n_ctx=256, verify_capacity=4, dtype="bfloat16", device=device)
    prefix, rows = [2, 818, 5279, 529, 7001, 563], [6290, 236764, 532]
    trunk.prefill(prefix)
    together = trunk.forward(rows).logits.cpu()
    identical = []
    for j in range(len(rows)):
        trunk.rewind(len(prefix))
        if j:
            trunk.forward(rows[:j])
        identical.append(bool(torch.equal(trunk.forward([rows[j]]).logits.cpu()[0], together[j])))
    assert all(identical), identical
    return {"rows_identical_alone_and_together": identical}


def decode_bench(gguf: GGUFFile, device: str, tokens: int) -> dict[str, Any]:
    trunk = load_trunk(gguf, n_ctx=512, verify_capacity=1, dtype="bfloat16", device=device)
    prompt = list(range(100, 164))
    synchronise = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    started = time.perf_counter()
    stream = [int(trunk.prefill(prompt).logits[-1].argmax())]
    synchronise()
    prefilled = time.perf_counter()
    while len(stream) < tokens:
        stream.append(int(trunk.forward([stream[-1]]).logits[0].argmax()))
    synchronise()
    done = time.perf_counter()
    return {"dtype": "bfloat16", "prompt_tokens": len(prompt), "prefill_tok_s": len(prompt) / (prefilled - started),
            "decode_tokens": tokens, "decode_tok_s": (tokens - 1) / (done - prefilled)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--gguf", type=Path, default=GEMMA)
    parser.add_argument("--out", type=Path, default=Path("gpu-check.json"))
    parser.add_argument("--quick", action="store_true", help="fewer rows and tokens (a dry run on the CPU)")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"gpu-check: torch {torch.__version__} sees no CUDA device; nothing to measure")
    gguf = GGUFFile(args.gguf)
    rows, tokens = (32, 8) if args.quick else (1024, 64)
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu (Triton interpreter)",
        "torch": torch.__version__, "triton": __import__("triton").__version__, "gguf": args.gguf.name,
        "kernel_backend": dispatch.backend(torch.device(args.device)), "interpreted": dispatch.interpreted(),
    }
    part(results, "dequant", lambda: check_dequant(gguf, args.device, rows))
    part(results, "qmatmul", lambda: check_qmatmul(gguf, args.device, rows))
    part(results, "argmax_kernels", lambda: check_argmax_kernels(args.device))
    part(results, "trunk_rows", lambda: check_trunk(gguf, args.device))
    part(results, "decode", lambda: decode_bench(gguf, args.device, tokens))
    args.out.write_text(json.dumps(results, indent=2))
    print(f"gpu-check: wrote {args.out}")
    failed = [name for name, value in results.items() if isinstance(value, dict) and not value.get("ok", True)]
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
