"""Kernel bandwidth on a GPU: each Triton kernel's achieved bytes/s against the device's peak.

Run `python -m power.kernels.bench [--json]` on a CUDA machine. Every kernel is
timed with `triton.testing.do_bench` in the same run as a device-to-device
copy, so the report gives two ratios per kernel: against the memory's nominal
peak (memory clock and bus width from the device properties) and against what a
plain copy achieves on this device right now. Bytes are the kernel's compulsory
traffic: what it must read and write at least once (column `bytes`). Each
result is first compared with the torch reference on the same inputs, within the
tolerance docs/kernels.md gives for that kernel; a mismatch exits 1.

Without a GPU there is nothing honest to measure: it says so and exits 0.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, Callable

import click
import torch

NEEDS_GPU = "kernels/bench.py measures the Triton kernels on a CUDA GPU; none is present here, so nothing was measured."


@dataclass(frozen=True)
class Case:
    kernel: str
    shape: str
    call: Callable[[], Any]
    nbytes: int  # compulsory traffic
    agrees: Callable[[Any, Any], bool]  # (Triton result, reference result) -> within the kernel's documented tolerance


@dataclass(frozen=True)
class Result:
    kernel: str
    shape: str
    ms: float
    bytes: int
    gbps: float
    of_peak: float | None
    of_copy: float
    matches_reference: bool


def peak_gbps(device: int) -> float | None:
    """Nominal memory bandwidth: double data rate x memory clock x bus width (None if the driver reports neither)."""
    props = torch.cuda.get_device_properties(device)
    clock_khz = getattr(props, "memory_clock_rate", 0)
    bus_bits = getattr(props, "memory_bus_width", 0)
    return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9 if clock_khz and bus_bits else None


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def _same_ints(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> bool:
    return [int(t) for t in a] == [int(t) for t in b]


def _within_fp32_bound(x: torch.Tensor, w: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor], bool]:
    """Two fp32 results of x @ w.T may differ by twice the accumulation bound K * 2^-24 * (|x| @ |w|.T)."""
    bound = 2 * x.shape[1] * 2.0**-24 * (x.abs() @ w.abs().T)
    return lambda a, b: bool(((a - b).abs() <= bound).all())


def cases(device: str) -> list[Case]:
    """The shapes the runtime runs, on `device`."""
    from power.kernels import dispatch
    from power.kernels.dequant import BLOCK_LAYOUT, dequantize_reference

    gen = torch.Generator(device=device).manual_seed(0)
    out: list[Case] = []

    rows, cols = 4096, 4096
    for qtype in ("Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q6_K"):
        per_block, block_bytes = BLOCK_LAYOUT[qtype]
        raw = _scaled_blocks(qtype, rows * cols // per_block, block_bytes, device, gen)
        out.append(Case(f"dequantize {qtype}", f"{rows}x{cols}", partial(dispatch.dequantize, qtype, raw, (rows, cols)),
                        raw.numel() + rows * cols * 4, _same_bits))
        if qtype in ("Q4_K", "Q8_0"):
            weight = raw.view(rows, -1)
            dense = dequantize_reference(qtype, raw, (rows, cols))
            for m in (1, 8, 16):
                x = torch.randn(m, cols, device=device, generator=gen)
                out.append(Case(f"qmatmul {qtype}", f"{m}x{cols} @ {rows}x{cols}",
                                partial(dispatch.qmatmul, x, weight, qtype),
                                weight.numel() + x.numel() * 4 + m * rows * 4, _within_fp32_bound(x, dense)))

    vocab = 262_144
    logits = torch.randn(17, vocab, device=device, generator=gen)
    proposals = logits[:16].argmax(dim=-1)
    out.append(Case("greedy_verify", f"17x{vocab} f32", lambda: dispatch.greedy_verify(logits, proposals),
                    logits.numel() * 4, _same_ints))

    # Small integers: every score is exact, so both paths must pick the same (lowest) ID.
    head = torch.randint(-3, 4, (vocab, 640), device=device, generator=gen).to(torch.float16)
    hidden = torch.randint(-3, 4, (8, 640), device=device, generator=gen).to(torch.float16)
    for n_prefix in (8192, vocab):
        out.append(Case("fr_argmax", f"8x640 @ {n_prefix}x640 f16", partial(dispatch.fr_argmax, hidden, head, n_prefix),
                        n_prefix * 640 * 2, torch.equal))

    probs = torch.softmax(torch.randn(17, vocab, device=device, generator=gen), dim=-1)
    uniforms = torch.rand(17, 3, device=device, generator=gen, dtype=torch.float64)
    draft = torch.softmax(torch.randn(16, vocab, device=device, generator=gen), dim=-1)
    # A draft unlike the target rejects early: the residual draw reads one target and one draft row.
    out.append(Case("rejection_step", f"K=16 V={vocab} f32",
                    lambda: dispatch.rejection_step(probs, draft, proposals, uniforms),
                    2 * vocab * 4, _same_ints))
    return out


def _scaled_blocks(qtype: str, n_blocks: int, block_bytes: int, device: str, gen: torch.Generator) -> torch.Tensor:
    """Random quant blocks with a finite float16 scale (1/64) in every scale field."""
    raw = torch.randint(0, 256, (n_blocks, block_bytes), device=device, generator=gen, dtype=torch.uint8)
    scale = torch.tensor([1 / 64], dtype=torch.float16).view(torch.uint8).to(device)
    offsets = {"Q4_K": (0, 2), "Q6_K": (208,)}.get(qtype, (0,))
    for offset in offsets:
        raw[:, offset:offset + 2] = scale
    return raw.reshape(-1)


def _reference_result(call: Callable[[], Any]) -> Any:
    previous = os.environ.get("POWER_KERNELS")
    os.environ["POWER_KERNELS"] = "reference"
    try:
        return call()
    finally:
        if previous is None:
            del os.environ["POWER_KERNELS"]
        else:
            os.environ["POWER_KERNELS"] = previous


def measure(device: int = 0) -> tuple[list[Result], float | None, float]:
    import triton.testing

    torch.cuda.set_device(device)
    name = f"cuda:{device}"
    copy_gbps = _copy_gbps(name)
    peak = peak_gbps(device)
    results = []
    for case in cases(name):
        matches = case.agrees(case.call(), _reference_result(case.call))
        ms = triton.testing.do_bench(case.call)
        gbps = case.nbytes / ms / 1e6
        results.append(Result(case.kernel, case.shape, ms, case.nbytes, gbps, gbps / peak if peak else None,
                              gbps / copy_gbps, matches))
    return results, peak, copy_gbps


def _copy_gbps(device: str) -> float:
    """Device-to-device copy bandwidth over 1 GiB (its buffers are freed on return)."""
    import triton.testing

    source = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    copy_ms = triton.testing.do_bench(lambda: target.copy_(source))
    return 2 * source.numel() / copy_ms / 1e6


@click.command(name="python -m power.kernels.bench", help=__doc__.splitlines()[0])
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--device", default=0, show_default=True, help="CUDA device index.")
def main(as_json: bool, device: int) -> None:
    if not torch.cuda.is_available():
        click.echo(json.dumps({"device": None, "measured": False, "reason": NEEDS_GPU}) if as_json else NEEDS_GPU)
        return
    results, peak, copy_gbps = measure(device)
    device_name = torch.cuda.get_device_name(device)
    if as_json:
        click.echo(json.dumps({"device": device_name, "measured": True, "peak_gbps": peak, "copy_gbps": copy_gbps,
                               "results": [asdict(r) for r in results]}, indent=2))
        _exit_on_mismatch(results)
        return
    peak_text = f"{peak:.0f} GB/s nominal" if peak else "nominal peak unknown"
    click.echo(f"{device_name}: {peak_text}; device-to-device copy {copy_gbps:.0f} GB/s")
    click.echo(f"{'kernel':<16} {'shape':<28} {'ms':>9} {'bytes':>12} {'GB/s':>8} {'of peak':>8} "
               f"{'of copy':>8}  = reference")
    for r in results:
        of_peak = f"{r.of_peak:.0%}" if r.of_peak is not None else "-"
        click.echo(f"{r.kernel:<16} {r.shape:<28} {r.ms:>9.4f} {r.bytes:>12} {r.gbps:>8.0f} "
                   f"{of_peak:>8} {r.of_copy:>8.0%}  {'yes' if r.matches_reference else 'NO'}")
    _exit_on_mismatch(results)


def _exit_on_mismatch(results: list[Result]) -> None:
    wrong = [f"{r.kernel} {r.shape}" for r in results if not r.matches_reference]
    if wrong:
        click.echo(f"Triton disagrees with the torch reference for: {', '.join(wrong)}", err=True)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
