"""The device check (`scripts/gpu-check`): the CUDA path's exactness and a decode bench, every figure in one JSON file.

On a CUDA machine it runs, in one process and in this order:

- **qmatmul**: the Triton kernel on every GGUF type the runtime keeps packed on a GPU, row-count invariant at every row count
  1..16 (each prefix of a 16-row call and each row alone give the bits of the 16-row call), within the fp32 error
  bound of the exact product, and bit-equal to the torch reference on exactly representable inputs;
- **speculation**: greedy n-gram speculation emits the plain greedy tokens, on a fixture target and on Gemma;
- **batching**: a request decoded alone and beside another in one slot-batched trunk gives the same tokens;
- **bench**: Gemma forwards at 1 row and at K+1 rows (K = the plan default, 7) and plain greedy decode, in tok/s.

Each check records what it found (never a hard-coded figure); a check that raises is recorded as failed with its
error. Exit 0: every check passed; 1: one failed or could not run (e.g. Gemma missing); 2: no CUDA device.

`--interpret` is for this module's own test only: the same checks on the CPU under Triton's interpreter, on tiny
shapes and a short stream, with the fixture target standing in for Gemma, so the script and its JSON writer are exercised without a GPU. Its figures measure the
interpreter, not a GPU, and the report says `"interpreted": true`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import triton

from power.artifacts import factory
from power.artifacts.atomic import write_text_atomic
from power.kernels import dispatch
from power.kernels.blocks import random_blocks
from power.kernels.dequant import dequantize_reference
from power.kernels.qmatmul import SUPPORTED, qmatmul_reference, step_size
from power.runtime.decoder import Decoder
from power.runtime.gguf_weights import GGUFFile
from power.runtime.sampling import Sampler, SamplingParams
from power.runtime.scheduler import SchedulerConfig
from power.runtime.speculators import registry
from power.runtime.speculators.base import Decline, NGramWindow, SpeculatorRequest
from power.runtime.trunks import load_trunk
from power.runtime.trunks.base import Part

NO_DEVICE = 2
PLAN_K = 7  # the profile default spec_draft_max (power.orchestrator.schema); verify_capacity K + 1
ROW_COUNTS = range(1, 17)
GEMMA = Path("models") / "gemma-3-270m-q4_k_m.gguf"
# A repetitive prompt (token IDs, no tokenizer needed) so the n-gram lookup finds drafts.
ECHO = [2, 818, 5279, 529, 9405, 563, 496, 3395, 236761] * 4


class Shapes:
    """How big each check runs: a GPU's real sizes, or the interpreter's tiny ones."""

    def __init__(self, interpret: bool) -> None:
        self.out_features = 37 if interpret else 2048
        self.blocks_per_row = 1 if interpret else 8
        self.tokens = 16 if interpret else 64
        self.bench_repeats = 1 if interpret else 20
        self.n_ctx = 128 if interpret else 512


def main(argv: Sequence[str] | None = None) -> int:
    args = _arguments().parse_args(argv)
    if not args.interpret and not torch.cuda.is_available():
        print(f"gpu-check: no CUDA device (torch {torch.__version__} sees none); nothing was measured. "
              "Run it on a machine with a GPU and a CUDA build of torch.", file=sys.stderr)
        return NO_DEVICE
    if args.interpret and not dispatch.interpreted():
        print("gpu-check: --interpret needs TRITON_INTERPRET=1 set before power.kernels is imported", file=sys.stderr)
        return NO_DEVICE
    device = "cpu" if args.interpret else "cuda"
    if args.interpret:
        os.environ["POWER_KERNELS"] = "triton"
    shapes = Shapes(args.interpret)
    started = time.perf_counter()
    report: dict[str, Any] = {"interpreted": args.interpret, "environment": _environment(device)}
    fixture = factory.build_dense_target(args.work)
    gemma = fixture if args.interpret else args.gemma if args.gemma.is_file() else None
    report["checks"] = {
        "qmatmul": _run(lambda: qmatmul_checks(device, shapes)),
        "speculation_fixture": _run(lambda: speculation_check(fixture, device, shapes)),
        "speculation_gemma": _needs(gemma, lambda g: speculation_check(g, device, shapes)),
        "batching_fixture": _run(lambda: batching_check(fixture, device, shapes)),
    }
    report["real_rows_probe"] = _needs(gemma, lambda g: real_rows_probe(g, device, shapes))
    report["bench"] = _needs(gemma, lambda g: decode_bench(g, device, shapes))
    report["seconds"] = round(time.perf_counter() - started, 1)
    ran = (*report["checks"].values(), report["real_rows_probe"], report["bench"])
    report["passed"] = all(check.get("passed") for check in ran)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(f"gpu-check: {'passed' if report['passed'] else 'FAILED'} in {report['seconds']} s; figures in {args.out}")
    return 0 if report["passed"] else 1


def _arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n\n")[0])
    default_out = Path(os.environ.get("OUT", "out")) / "gpu-check.json"
    parser.add_argument("--out", type=Path, default=default_out, help=f"the JSON file (default {default_out})")
    parser.add_argument("--gemma", type=Path, default=GEMMA, help=f"the Gemma 3 270M GGUF (default {GEMMA})")
    parser.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")),
                        help="where the fixture GGUF is written")
    parser.add_argument("--interpret", action="store_true", help="tests only: Triton's interpreter on the CPU")
    return parser


def _environment(device: str) -> dict[str, Any]:
    facts: dict[str, Any] = {"torch": torch.__version__, "triton": triton.__version__,
                             "python": platform.python_version(), "device": device}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        facts |= {"gpu": props.name, "capability": f"{props.major}.{props.minor}", "cuda": torch.version.cuda,
                  "memory_gib": round(props.total_memory / 2**30, 1)}
    return facts


def _run(check: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return check()
    except Exception as error:  # a failed check is a figure of the report, not the end of the run
        return {"passed": False, "error": f"{type(error).__name__}: {error}"}


def _needs(path: Path | None, check: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    if path is None:
        return {"passed": False, "error": f"not run: {GEMMA} is missing (pass --gemma PATH)"}
    return _run(lambda: check(path))


def qmatmul_checks(device: str, shapes: Shapes) -> dict[str, Any]:
    """Per GGUF type: row-count invariance at 1..16 rows, the fp32 bound, and bits on exactly representable inputs."""
    results = {qtype: _qmatmul_check(qtype, device, shapes) for qtype in sorted(SUPPORTED)}
    return {"passed": all(r["row_count_invariant"] and r["within_fp32_bound"] and r["exact_inputs_equal"]
                          for r in results.values()), "row_counts": [ROW_COUNTS[0], ROW_COUNTS[-1]], "types": results}


def _qmatmul_check(qtype: str, device: str, shapes: Shapes) -> dict[str, Any]:
    inner, n_out = step_size(qtype) * shapes.blocks_per_row, shapes.out_features
    weight = random_blocks(qtype, n_out, inner, seed=11).to(device)
    x = torch.randn(ROW_COUNTS[-1], inner, generator=torch.Generator().manual_seed(5)).to(device)
    full = dispatch.qmatmul(x, weight, qtype)
    prefixes = all(torch.equal(dispatch.qmatmul(x[:rows].contiguous(), weight, qtype), full[:rows])
                   for rows in ROW_COUNTS)
    alone = all(torch.equal(dispatch.qmatmul(x[i:i + 1].contiguous(), weight, qtype), full[i:i + 1])
                for i in range(len(ROW_COUNTS)))
    w = dequantize_reference(qtype, weight.cpu().reshape(-1), (n_out, inner)).double()
    exact = x.cpu().double() @ w.T
    gamma = inner * 2.0**-24 / (1 - inner * 2.0**-24)
    error = (full.cpu().double() - exact).abs()
    exact_weight = random_blocks(qtype, n_out, inner, seed=8, scale=2.0**-8).to(device)
    signs = torch.randint(-1, 2, (3, inner), generator=torch.Generator().manual_seed(4)).float().to(device)
    kernel = dispatch.qmatmul(signs, exact_weight, qtype)
    reference = qmatmul_reference(signs, exact_weight, qtype)
    return {"shape": [n_out, inner], "row_count_invariant": prefixes and alone,
            "within_fp32_bound": bool((error <= gamma * (x.cpu().double().abs() @ w.abs().T)).all()),
            "max_abs_error": float(error.max()), "exact_inputs_equal": bool(torch.equal(kernel, reference))}


def speculation_check(target: Path, device: str, shapes: Shapes) -> dict[str, Any]:
    """Greedy n-gram speculation (K = 7) against plain greedy decoding of the same target."""
    plain = _decode(target, device, shapes, speculate=False)
    spec = _decode(target, device, shapes, speculate=True)
    stats = spec.stats
    return {"passed": spec.tokens == plain.tokens, "target": target.name, "tokens": len(plain.tokens), "proposed": stats.proposed,
            "accepted": stats.accepted, "first_difference": _first_difference(plain.tokens, spec.tokens)}


def _decode(target: Path, device: str, shapes: Shapes, speculate: bool):
    trunk = load_trunk(target, n_ctx=shapes.n_ctx, verify_capacity=PLAN_K + 1, device=device)
    return _decoder(trunk, target, speculate).generate(_echo(trunk), shapes.tokens)


def _decoder(trunk, target: Path, speculate: bool) -> Decoder:
    drafter = None
    if speculate:
        request = SpeculatorRequest(trunk=trunk, target=GGUFFile(target), ngram=NGramWindow(2, 1, PLAN_K))
        built = registry.build("ngram", request)
        if isinstance(built, Decline):
            raise RuntimeError(f"the n-gram speculator declined: {built}")
        drafter = built
    return Decoder(trunk, Sampler(SamplingParams()), drafter, SchedulerConfig(k=PLAN_K, s=PLAN_K))


def _echo(trunk) -> list[int]:
    """ECHO within the target's vocabulary (the fixture's is small)."""
    return [token % trunk.config.vocab_size for token in ECHO]


def batching_check(target: Path, device: str, shapes: Shapes) -> dict[str, Any]:
    """Two sequences' rows in one forward give each the logits it gets alone (a request alone == batched)."""
    alone = load_trunk(target, n_ctx=shapes.n_ctx, verify_capacity=PLAN_K + 1, device=device)
    paired = load_trunk(target, n_ctx=shapes.n_ctx, verify_capacity=PLAN_K + 1, device=device, slots=2)
    echo = _echo(alone)
    first, second = echo[:5], echo[9:12]
    solo = alone.forward(first).logits
    together = paired.forward_parts([Part(0, first), Part(1, second)])[0].logits
    return {"passed": bool(torch.equal(solo, together)), "rows": [len(first), len(second)],
            "real_rows": alone.real_rows}


def real_rows_probe(target: Path, device: str, shapes: Shapes) -> dict[str, Any]:
    """Would a forward on its real rows be exact here? A measurement for the next session, not a check: the trunk
    runs one row unpadded, then the same row first of K+1 unpadded rows, and reports whether the logits agree to the
    bit. A GPU trunk keeps its fixed shapes (`real_rows` False) until this holds on every target and row count."""
    trunk = load_trunk(target, n_ctx=shapes.n_ctx, verify_capacity=PLAN_K + 1, device=device)
    ruled = trunk.real_rows
    trunk.real_rows = True
    prompt = _echo(trunk)[:16]
    trunk.prefill(prompt)
    step = prompt[:PLAN_K + 1]
    by_rows = {}
    for rows in range(1, PLAN_K + 2):
        by_rows[rows] = trunk.forward(step[:rows]).logits[:1]
        trunk.rewind(len(prompt))
    same = {rows: bool(torch.equal(logits, by_rows[1])) for rows, logits in by_rows.items()}
    return {"passed": True, "target": target.name, "real_rows_as_ruled": ruled,
            "first_row_same_bits_at_row_counts": same, "invariant": all(same.values())}


def decode_bench(target: Path, device: str, shapes: Shapes) -> dict[str, Any]:
    """Forwards of 1 and K+1 rows (rewound after each) and a plain greedy decode, timed after a warm-up."""
    trunk = load_trunk(target, n_ctx=shapes.n_ctx, verify_capacity=PLAN_K + 1, device=device)
    prompt = _echo(trunk)[:16]
    trunk.prefill(prompt)
    figures: dict[str, Any] = {"passed": True, "target": target.name, "k": PLAN_K, "real_rows": trunk.real_rows,
                               "cuda_graphs": False,  # the runtime captures none yet (docs/runtime.md, GPU path)
                               "instruction_path": trunk.instruction_path, "weight_bytes": trunk.weight_bytes}
    for rows in (1, PLAN_K + 1):
        seconds = _time_forward(trunk, prompt[:rows], len(prompt), shapes.bench_repeats, device)
        figures[f"forward_{rows}_rows_ms"] = round(seconds * 1e3, 3)
        figures[f"forward_{rows}_rows_tok_s"] = round(rows / seconds, 1)
    trunk.reset()
    decoder = _decoder(trunk, target, speculate=False)
    started = time.perf_counter()
    generation = decoder.generate(_echo(trunk), shapes.tokens)
    _synchronise(device)
    figures["plain_decode_tok_s"] = round(len(generation.tokens) / (time.perf_counter() - started), 1)
    figures["plain_decode_tokens"] = len(generation.tokens)
    figures["plain_decode_prompt_tokens"] = len(ECHO)  # its prefill is inside the timing
    return figures


def _time_forward(trunk, tokens: Sequence[int], position: int, repeats: int, device: str) -> float:
    trunk.forward(tokens)
    trunk.rewind(position)
    _synchronise(device)
    started = time.perf_counter()
    for _ in range(repeats):
        trunk.forward(tokens)
        trunk.rewind(position)
    _synchronise(device)
    return (time.perf_counter() - started) / repeats


def _synchronise(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


if __name__ == "__main__":
    sys.exit(main())
