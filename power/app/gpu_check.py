"""The device check (`scripts/gpu-check`): the CUDA path's exactness and a decode bench, every figure in one JSON file.

On a CUDA machine it runs, in one process and in this order:

- **qmatmul**: the Triton kernel on every GGUF type the runtime keeps packed on a GPU, row-count invariant at every row
  count 1..16 (each prefix of a 16-row call and each row alone give the bits of the 16-row call), within the fp32 error
  bound of the exact product, and bit-equal to the torch reference on exactly representable inputs;
- **attention**, **rms_norm**: the GPU path's attention (with its cache write) and norms, row-count invariant the same
  way, within their stated bounds of float64 (`power.kernels.attention`, `power.kernels.norm`);
- **speculation**: greedy n-gram speculation emits the plain greedy tokens, on a fixture target and on Gemma;
- **batching**: a request decoded alone and beside another in one slot-batched trunk gives the same tokens;
- **real_rows**: the GPU trunk runs real rows, and Gemma's row j of every forward of 1..K+1 rows equals the row alone;
- **cuda_graphs**: Gemma decoded greedily with CUDA graphs and without: the same logits, bit for bit, at every plain
  step, the same tokens and counts under n-gram speculation (1..K+1 rows), and two slots' rows in one graphed forward;
- **bench**: Gemma forwards at 1 row and at K+1 rows (K = the plan default, 7) and plain greedy decode, in tok/s, each
  without and with CUDA graphs.

Each check records what it found (never a hard-coded figure); a check that raises is recorded as failed with its
error. Exit 0: every check passed; 1: one failed or could not run (e.g. Gemma missing); 2: no CUDA device.

`--interpret` is for this module's own test only: the same checks on the CPU, on tiny shapes and a short stream, with
the fixture target standing in for Gemma: the kernel checks run the Triton kernels under the interpreter, the trunk
checks run the GPU path with the kernels' torch references (the interpreter would take minutes), and `Rerun` stands in
for the graph capture. So the script and its JSON writer are exercised without a GPU; its figures measure the CPU,
not a GPU, and the report says `"interpreted": true`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
import triton

from power.artifacts import factory
from power.artifacts.atomic import write_text_atomic
from power.kernels import dispatch
from power.kernels.attention import attention_bound, cache_write_reference
from power.kernels.blocks import random_blocks
from power.kernels.dequant import dequantize_reference
from power.kernels.qmatmul import SUPPORTED, qmatmul_reference, step_size
from power.orchestrator.inputs.schema import DEFAULT_DRAFT_MAX as PLAN_K  # verify_capacity K + 1
from power.runtime.cuda_graphs import Recorder, Rerun
from power.runtime.decoder import Decoder
from power.runtime.gguf_weights import GGUFFile
from power.runtime.sampling import Sampler, SamplingParams
from power.runtime.scheduler import SchedulerConfig
from power.runtime.speculators import registry
from power.runtime.speculators.base import Decline, NGramWindow, SpeculatorRequest
from power.runtime.trunks import load_trunk
from power.runtime.trunks.base import Part

NO_DEVICE = 2
ROW_COUNTS = range(1, 17)
GEMMA = Path("models") / "gemma-3-270m-q4_k_m.gguf"
# A repetitive prompt (token IDs, no tokenizer needed) so the n-gram lookup finds drafts.
ECHO = [2, 818, 5279, 529, 9405, 563, 496, 3395, 236761] * 4


class Shapes:
    """How big each check runs: a GPU's real sizes, or the interpreter's tiny ones."""

    def __init__(self, interpret: bool) -> None:
        self.interpret = interpret
        self.out_features = 37 if interpret else 2048
        self.blocks_per_row = 1 if interpret else 8
        self.tokens = 16 if interpret else 64
        self.bench_repeats = 1 if interpret else 20
        self.n_ctx = 128 if interpret else 512
        # attention: (query heads per KV head, KV heads, head width, cache slots); Gemma 3 270M's is (4, 1, 256)
        self.attention = (3, 2, 16, 256) if interpret else (4, 1, 256, 1024)
        self.norm_widths = (40, 16) if interpret else (640, 256)  # a model row, a head row

    @property
    def trunk_kernels(self) -> str:
        """POWER_KERNELS for the trunk checks: the GPU's rule, or the references on the CPU
        (the interpreter is slow)."""
        return "reference" if self.interpret else "auto"

    def recorder(self) -> Recorder | None:
        """The CUDA capture on a GPU (None: the trunk's own), `Rerun` on the CPU."""
        return Rerun() if self.interpret else None


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
    shapes = Shapes(args.interpret)
    started = time.perf_counter()
    report: dict[str, Any] = {"interpreted": args.interpret, "environment": _environment(device)}
    fixture = factory.build_dense_target(args.work)
    gemma = fixture if args.interpret else args.gemma if args.gemma.is_file() else None
    kernels, trunks = ("triton" if args.interpret else "auto"), shapes.trunk_kernels
    report["checks"] = {
        "qmatmul": _run(kernels, lambda: qmatmul_checks(device, shapes)),
        "attention": _run(kernels, lambda: attention_check(device, shapes)),
        "rms_norm": _run(kernels, lambda: norm_check(device, shapes)),
        "speculation_fixture": _run(trunks, lambda: speculation_check(fixture, device, shapes)),
        "speculation_gemma": _needs(gemma, trunks, lambda g: speculation_check(g, device, shapes)),
        "batching_fixture": _run(trunks, lambda: batching_check(fixture, device, shapes)),
        "real_rows": _needs(gemma, trunks, lambda g: real_rows_check(g, device, shapes)),
        "cuda_graphs": _needs(gemma, trunks, lambda g: graphs_check(g, device, shapes)),
    }
    report["bench"] = _needs(gemma, trunks, lambda g: decode_bench(g, device, shapes))
    report["seconds"] = round(time.perf_counter() - started, 1)
    ran = (*report["checks"].values(), report["bench"])
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


def _run(kernels: str, check: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One check with POWER_KERNELS=`kernels`, its error recorded as its result."""
    try:
        with _power_kernels(kernels):
            return check()
    except Exception as error:  # a failed check is a figure of the report, not the end of the run
        return {"passed": False, "error": f"{type(error).__name__}: {error}"}


def _needs(path: Path | None, kernels: str, check: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    if path is None:
        return {"passed": False, "error": f"not run: {GEMMA} is missing (pass --gemma PATH)"}
    return _run(kernels, lambda: check(path))


@contextlib.contextmanager
def _power_kernels(kernels: str) -> Iterator[None]:
    before = os.environ.get("POWER_KERNELS")
    os.environ["POWER_KERNELS"] = kernels
    try:
        yield
    finally:
        if before is None:
            del os.environ["POWER_KERNELS"]
        else:
            os.environ["POWER_KERNELS"] = before


def _trunk(target: Path, device: str, shapes: Shapes, slots: int = 1):
    """The GPU path's trunk (on the CPU too, under --interpret), forwards of up to K+1 rows."""
    return load_trunk(target, n_ctx=shapes.n_ctx, verify_capacity=PLAN_K + 1, device=device, slots=slots,
                      kernel_path="gpu")


def _invariant(call: Callable[[slice], torch.Tensor], rows: int) -> bool:
    """Every prefix of `rows` rows and every row alone give the bits of the whole call."""
    full = call(slice(0, rows))
    return (all(torch.equal(call(slice(0, n)), full[:n]) for n in range(1, rows + 1))
            and all(torch.equal(call(slice(i, i + 1)), full[i:i + 1]) for i in range(rows)))


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


def attention_check(device: str, shapes: Shapes) -> dict[str, Any]:
    """The attention kernel over two slots, global and windowed, at row counts 1..16 and within its bound of float64;
    the cache write against its reference, bit for bit."""
    group, n_kv, width, capacity = shapes.attention
    generator = torch.Generator().manual_seed(3)
    k_cache = torch.randn(2, n_kv, capacity, width, generator=generator).to(device)
    v_cache = torch.randn(2, n_kv, capacity, width, generator=generator).to(device)
    rows = ROW_COUNTS[-1]
    q = torch.randn(rows, n_kv * group, width, generator=generator).to(device)
    positions = torch.randint(0, capacity, (rows,), generator=generator).to(device)
    slots = torch.randint(0, 2, (rows,), generator=generator).to(device)
    results: dict[str, Any] = {"shape": {"group": group, "kv_heads": n_kv, "width": width, "cache": capacity}}
    for window in (0, capacity // 2):
        def call(part: slice, window: int = window) -> torch.Tensor:
            return dispatch.attention(q[part].contiguous(), k_cache, v_cache, slots[part].contiguous(),
                                      positions[part].contiguous(), width**-0.5, window)
        exact, bound = attention_bound(q, k_cache, v_cache, slots, positions, width**-0.5, window)
        error = (call(slice(0, rows)).double() - exact).abs()
        results[f"window_{window}"] = {"row_count_invariant": _invariant(call, rows),
                                       "within_bound": bool((error <= bound).all()),
                                       "max_abs_error": float(error.max()), "max_bound": float(bound.max())}
    k, v = torch.randn(2, rows, n_kv, width, generator=generator).to(device)
    written = [(k_cache.clone(), v_cache.clone()) for _ in range(2)]
    padded = torch.where(torch.arange(rows, device=device) % 5 == 4, -1, slots)  # every fifth row a padding row
    distinct = torch.arange(rows, device=device) * (capacity // rows)  # one cache row per query row
    dispatch.cache_write(k, v, *written[0], padded, distinct)
    cache_write_reference(k, v, *written[1], padded, distinct)
    results["cache_write_equal"] = all(torch.equal(a, b) for a, b in zip(*written, strict=True))
    results["passed"] = results["cache_write_equal"] and all(
        results[f"window_{w}"]["row_count_invariant"] and results[f"window_{w}"]["within_bound"]
        for w in (0, capacity // 2))
    return results


def norm_check(device: str, shapes: Shapes) -> dict[str, Any]:
    """The RMS norm on model-width rows and per-head rows, and the L2 norm: row counts 1..16, and close to float64
    (relative gamma_d / 2 + 6 u, doubled; tests/test_kernel_norm.py derives it)."""
    results: dict[str, Any] = {}
    generator = torch.Generator().manual_seed(4)
    model, head = shapes.norm_widths
    cases = {"model_rows": ((ROW_COUNTS[-1], model), (model,), True),
             "head_rows": ((ROW_COUNTS[-1], 5, head), (5, head), True),
             "l2_head_rows": ((ROW_COUNTS[-1], 5, head), None, False)}
    for name, (shape, weight_shape, mean) in cases.items():
        x = (torch.randn(shape, generator=generator) * 3).to(device)
        weight = torch.randn(weight_shape, generator=generator).to(device) if weight_shape else None

        def call(part: slice, x: torch.Tensor = x, weight: torch.Tensor | None = weight, mean: bool = mean):
            return dispatch.rms_norm(x[part].contiguous(), weight, 1e-6, mean=mean)
        squares = x.double().pow(2)
        reduced = squares.mean(-1, keepdim=True) if mean else squares.sum(-1, keepdim=True)
        exact = x.double() / torch.sqrt(reduced + 1e-6) * (1 if weight is None else weight.double())
        width, u = shape[-1], 2.0**-24
        tolerance = 2 * (width * u / (1 - width * u) / 2 + 6 * u) * exact.abs()
        error = (call(slice(0, shape[0])).double() - exact).abs()
        results[name] = {"row_count_invariant": _invariant(call, shape[0]),
                         "within_bound": bool((error <= tolerance).all()), "max_abs_error": float(error.max())}
    results["passed"] = all(r["row_count_invariant"] and r["within_bound"] for r in results.values())
    return results


def speculation_check(target: Path, device: str, shapes: Shapes) -> dict[str, Any]:
    """Greedy n-gram speculation (K = 7) against plain greedy decoding of the same target."""
    plain = _decode(target, device, shapes, speculate=False)
    spec = _decode(target, device, shapes, speculate=True)
    stats = spec.stats
    return {"passed": spec.tokens == plain.tokens, "target": target.name, "tokens": len(plain.tokens),
            "proposed": stats.proposed,
            "accepted": stats.accepted, "first_difference": _first_difference(plain.tokens, spec.tokens)}


def _decode(target: Path, device: str, shapes: Shapes, speculate: bool, graphs: bool = False):
    trunk = _trunk(target, device, shapes)
    if graphs:
        trunk.capture_graphs(shapes.recorder())
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
    alone = _trunk(target, device, shapes)
    paired = _trunk(target, device, shapes, slots=2)
    echo = _echo(alone)
    first, second = echo[:5], echo[9:12]
    solo = alone.forward(first).logits
    together = paired.forward_parts([Part(0, first), Part(1, second)])[0].logits
    return {"passed": bool(torch.equal(solo, together)), "rows": [len(first), len(second)],
            "real_rows": alone.real_rows}


def real_rows_check(target: Path, device: str, shapes: Shapes) -> dict[str, Any]:
    """The GPU trunk runs real rows (every product, the attention and the norms row-count invariant), and they are:
    after a prompt, row j of a forward of n = 1..K+1 real rows equals token j forwarded alone, bit for bit."""
    trunk = _trunk(target, device, shapes)
    prompt = _echo(trunk)[:16]
    trunk.prefill(prompt)
    step = prompt[:PLAN_K + 1]
    alone = []
    for token in step:
        alone.append(trunk.forward([token]).logits[0])
    same = {}
    for rows in range(1, PLAN_K + 2):
        trunk.rewind(len(prompt))
        together = trunk.forward(step[:rows]).logits
        same[rows] = all(torch.equal(together[j], alone[j]) for j in range(rows))
    return {"passed": trunk.real_rows and all(same.values()), "target": target.name, "real_rows": trunk.real_rows,
            "rows_same_bits_at_row_counts": same}


def graphs_check(target: Path, device: str, shapes: Shapes) -> dict[str, Any]:
    """Greedy decoding with CUDA graphs equals it without: every plain step's logits bit for bit, the speculative
    stream and its counts, and two slots' rows in one graphed forward."""
    steps, recorder = {}, None
    for graphs in (False, True):
        trunk = _trunk(target, device, shapes)
        if graphs:
            trunk.capture_graphs(shapes.recorder())
            recorder = trunk.graphs.recorder.name if trunk.graphs is not None else None
        steps[graphs] = _greedy_steps(trunk, _echo(trunk)[:16], shapes.tokens)
    plain_same = len(steps[False]) == len(steps[True]) and all(
        torch.equal(a, b) for a, b in zip(steps[False], steps[True], strict=True))
    eager = _decode(target, device, shapes, speculate=True)
    graphed = _decode(target, device, shapes, speculate=True, graphs=True)
    paired, _ = _two_slots(target, device, shapes, graphs=False)
    paired_graphed, captured = _two_slots(target, device, shapes, graphs=True)
    paired_same = all(torch.equal(a, b) for a, b in zip(paired, paired_graphed, strict=True))
    speculative_same = (eager.tokens == graphed.tokens and eager.stats.proposed == graphed.stats.proposed
                        and eager.stats.accepted == graphed.stats.accepted)
    return {"passed": plain_same and speculative_same and paired_same, "target": target.name,
            "recorder": recorder,  # "cuda", or "rerun" (the interpreter's stand-in: no graph captured)
            "plain_steps": len(steps[True]), "plain_logits_same_bits": plain_same,
            "speculative_tokens_same": speculative_same, "speculative_proposed": graphed.stats.proposed,
            "speculative_accepted": graphed.stats.accepted, "two_slots_same_bits": paired_same,
            "two_slots_rows_captured": captured}


def _two_slots(target: Path, device: str, shapes: Shapes, graphs: bool) -> tuple[list[torch.Tensor], list[int]]:
    """Two slots' rows (1 + 3) in one forward: each slot's logits, and the row counts its graphs captured."""
    trunk = _trunk(target, device, shapes, slots=2)
    if graphs:
        trunk.capture_graphs(shapes.recorder())
    echo = _echo(trunk)
    trunk.prefill(echo[:9], slot=0)
    trunk.prefill(echo[3:7], slot=1)
    outs = trunk.forward_parts([Part(0, echo[9:10]), Part(1, echo[7:10])])
    return [out.logits for out in outs], trunk.graphs.captured if trunk.graphs is not None else []


def _greedy_steps(trunk, prompt: Sequence[int], tokens: int) -> list[torch.Tensor]:
    """Plain greedy decoding driven on the trunk: every step's logits row."""
    logits = [trunk.prefill(prompt).logits[-1]]
    for _ in range(tokens - 1):
        logits.append(trunk.forward([int(torch.argmax(logits[-1]))]).logits[0])
    return logits


def decode_bench(target: Path, device: str, shapes: Shapes) -> dict[str, Any]:
    """Forwards of 1 and K+1 rows (rewound after each) and a plain greedy decode, timed after a warm-up (which
    captures the graphs), each without and with CUDA graphs."""
    figures: dict[str, Any] = {"passed": True, "target": target.name, "k": PLAN_K, "cuda_graphs": not shapes.interpret}
    for graphs in (False, True):
        trunk = _trunk(target, device, shapes)
        if graphs:
            trunk.capture_graphs(shapes.recorder())
        label = "_graphs" if graphs else ""
        figures |= {"real_rows": trunk.real_rows, "instruction_path": trunk.instruction_path,
                    "weight_bytes": trunk.weight_bytes}
        prompt = _echo(trunk)[:16]
        trunk.prefill(prompt)
        held = _reserved(device)
        for rows in (1, PLAN_K + 1):
            seconds = _time_forward(trunk, prompt[:rows], len(prompt), shapes.bench_repeats, device)
            figures[f"forward_{rows}_rows{label}_ms"] = round(seconds * 1e3, 3)
            figures[f"forward_{rows}_rows{label}_tok_s"] = round(rows / seconds, 1)
        after = _reserved(device)
        if graphs and held is not None and after is not None:  # what the two captured shapes keep (one pool)
            figures["graphs_1_and_k1_rows_reserved_mib"] = round((after - held) / 2**20, 1)
        trunk.reset()
        decoder = _decoder(trunk, target, speculate=False)
        decoder.generate(_echo(trunk), 2)  # the first decode captures its graphs (and compiles), outside the timing
        trunk.reset()
        started = time.perf_counter()
        generation = decoder.generate(_echo(trunk), shapes.tokens)
        _synchronise(device)
        figures[f"plain_decode{label}_tok_s"] = round(len(generation.tokens) / (time.perf_counter() - started), 1)
    figures["plain_decode_tokens"] = shapes.tokens
    figures["plain_decode_prompt_tokens"] = len(ECHO)  # its prefill is inside the timing
    figures["graphs_speedup_decode"] = round(figures["plain_decode_graphs_tok_s"] / figures["plain_decode_tok_s"], 2)
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


def _reserved(device: str) -> int | None:
    """CUDA memory the allocator holds once its unused cached blocks are released (None off a GPU)."""
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved()


def _synchronise(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                None if len(a) == len(b) else min(len(a), len(b)))


if __name__ == "__main__":
    sys.exit(main())
