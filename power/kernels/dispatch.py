"""The one dispatch point: every kernel call in the runtime goes through here.

Rule: the Triton kernel on a CUDA device, the torch reference elsewhere.
`POWER_KERNELS` (read at each call) overrides it:
  auto       the rule above (default)
  triton     always Triton; CPU tensors need Triton's interpreter, which
             `power.kernels` selects (TRITON_INTERPRET=1) when no CUDA device exists
  reference  always the torch reference, on any device

Inputs are validated here, before either path runs: a wrong shape, dtype,
device or a non-contiguous tensor is a ValueError that names the argument and
says what was expected, never a wrong answer. Results stay on the inputs'
device; nothing here copies logits or probabilities to the host.
"""

from __future__ import annotations

import functools
import math
import os
from types import SimpleNamespace
from typing import Sequence

import torch

from power.kernels import dequant, interpreter
from power.kernels import fr_argmax as fr
from power.kernels import greedy_verify as gv
from power.kernels import qmatmul as qm
from power.kernels import rejection as rj

BACKENDS = ("auto", "triton", "reference")
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
PROBS = (torch.float32, torch.float64)
INTEGERS = (torch.int64, torch.int32)


@functools.cache
def triton_kernels() -> SimpleNamespace:
    """The Triton kernels, imported on first use: a run on the references never loads Triton (about 70 MiB of
    resident memory). Under Triton's interpreter its row-invariant dot is installed first (`interpreter`)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        interpreter.install()
    from power.kernels import dequant_triton, fr_argmax_triton, greedy_verify_triton, qmatmul_triton, rejection_triton

    return SimpleNamespace(dequant=dequant_triton, fr=fr_argmax_triton, gv=greedy_verify_triton, qm=qmatmul_triton,
                           rj=rejection_triton)


def interpreted() -> bool:
    """True when the kernels were decorated for Triton's CPU interpreter (Triton decides once, at import)."""
    import triton

    return not isinstance(triton_kernels().gv._accept_kernel, triton.runtime.JITFunction)


def backend(device: torch.device) -> str:
    """'triton' or 'reference' for work on `device`, following POWER_KERNELS."""
    choice = os.environ.get("POWER_KERNELS", "auto").strip().lower() or "auto"
    if choice not in BACKENDS:
        raise ValueError(f"POWER_KERNELS={choice!r} is not one of {', '.join(BACKENDS)}; unset it for auto")
    if choice == "auto":
        return "triton" if device.type == "cuda" else "reference"
    if choice == "triton" and device.type != "cuda" and not interpreted():
        raise ValueError(
            f"POWER_KERNELS=triton on a {device.type} device needs Triton's interpreter: "
            "set TRITON_INTERPRET=1 before power.kernels is imported, or use POWER_KERNELS=auto"
        )
    return choice


def _tensor(kernel: str, name: str, value: object, *, ndim: int, dtypes: Sequence[torch.dtype]) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{kernel}: `{name}` must be a torch.Tensor, got {type(value).__name__}")
    if value.dim() != ndim:
        raise ValueError(f"{kernel}: `{name}` must have {ndim} dimension(s), got shape {tuple(value.shape)}")
    if value.dtype not in dtypes:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        found = str(value.dtype).removeprefix("torch.")
        raise ValueError(f"{kernel}: `{name}` has dtype {found}; expected one of {allowed}")
    if not value.is_contiguous():
        raise ValueError(f"{kernel}: `{name}` is not contiguous; pass `{name}.contiguous()`")
    return value


def _same_device(kernel: str, **tensors: torch.Tensor) -> torch.device:
    devices = {name: t.device for name, t in tensors.items()}
    first = next(iter(devices.values()))
    if any(device != first for device in devices.values()):
        listing = ", ".join(f"`{n}` on {d}" for n, d in devices.items())
        raise ValueError(f"{kernel}: inputs must share one device, got {listing}")
    return first


def _nonempty(kernel: str, name: str, size: int, what: str) -> None:
    if size < 1:
        raise ValueError(f"{kernel}: `{name}` needs at least one {what}")


def dequantize(
    qtype: str, raw: torch.Tensor, shape: Sequence[int], *, device: torch.device | str | None = None
) -> torch.Tensor:
    """GGUF bytes of type `qtype` ("Q4_K", ...) -> float32 tensor of `shape` on `device` (default: raw's)."""
    raw = _tensor("dequantize", "raw", raw, ndim=1, dtypes=(torch.uint8,))
    if qtype not in dequant.REFERENCES:
        supported = ", ".join(dequant.REFERENCES)
        raise dequant.UnsupportedQuantType(f"dequantize: `qtype` {qtype!r} is not supported; expected one of {supported}")
    shape = tuple(int(s) for s in shape)
    if not shape or any(s < 1 for s in shape):
        raise ValueError(f"dequantize: `shape` must be non-empty with positive sizes, got {shape}")
    per_block, block_bytes = dequant.BLOCK_LAYOUT[qtype]
    if shape[-1] % per_block:
        raise ValueError(
            f"dequantize: `shape` {shape} has a last dimension that is not a multiple of {qtype}'s block of {per_block}"
        )
    expected = math.prod(shape) // per_block * block_bytes
    if raw.numel() != expected:
        raise ValueError(f"dequantize: `raw` holds {raw.numel()} bytes; {qtype} of shape {shape} needs {expected}")
    raw = raw.to(device) if device is not None else raw
    if backend(raw.device) == "triton" and qtype in dequant.TRITON_TYPES:
        return triton_kernels().dequant.dequantize_triton(qtype, raw, shape)
    return dequant.dequantize_reference(qtype, raw, shape)


def greedy_verify(logits: torch.Tensor, proposals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [K+1, V], proposals [K] -> (accepted count, next token) as 0-d int64 tensors on the device."""
    logits = _tensor("greedy_verify", "logits", logits, ndim=2, dtypes=FLOATS)
    proposals = _tensor("greedy_verify", "proposals", proposals, ndim=1, dtypes=INTEGERS)
    rows, vocab = logits.shape
    _nonempty("greedy_verify", "logits", vocab, "vocabulary column")
    if rows != proposals.numel() + 1:
        raise ValueError(
            f"greedy_verify: `logits` has {rows} rows but `proposals` has {proposals.numel()} entries; "
            "expected K+1 rows for K proposals"
        )
    device = _same_device("greedy_verify", logits=logits, proposals=proposals)
    if backend(device) == "triton":
        return triton_kernels().gv.greedy_verify_triton(logits, proposals)
    return gv.greedy_verify_reference(logits, proposals)


def rejection_step(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    proposals: torch.Tensor,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Leviathan/Chen verification of K proposals -> (accepted count, next token), 0-d int64 on the device.

    target_probs [K+1, V], draft_probs [K, V] (one-hot rows for a deterministic drafter),
    proposals [K], uniforms [K+1, 3] float64 in [0, 1): row i holds position i's draws in the
    column order of `power.runtime.sampling.Lane` (sample, accept, residual).
    """
    name = "rejection_step"
    target_probs = _tensor(name, "target_probs", target_probs, ndim=2, dtypes=PROBS)
    draft_probs = _tensor(name, "draft_probs", draft_probs, ndim=2, dtypes=(target_probs.dtype,))
    proposals = _tensor(name, "proposals", proposals, ndim=1, dtypes=INTEGERS)
    uniforms = _tensor(name, "uniforms", uniforms, ndim=2, dtypes=(torch.float64, torch.float32))
    rows, vocab = target_probs.shape
    k = proposals.numel()
    _nonempty(name, "target_probs", vocab, "vocabulary column")
    if rows != k + 1:
        raise ValueError(f"{name}: `target_probs` has {rows} rows but `proposals` has {k} entries; expected K+1")
    if tuple(draft_probs.shape) != (k, vocab):
        raise ValueError(f"{name}: `draft_probs` has shape {tuple(draft_probs.shape)}; expected ({k}, {vocab})")
    if tuple(uniforms.shape) != (k + 1, rj.LANES):
        raise ValueError(f"{name}: `uniforms` has shape {tuple(uniforms.shape)}; expected ({k + 1}, {rj.LANES})")
    device = _same_device(name, target_probs=target_probs, draft_probs=draft_probs, proposals=proposals,
                          uniforms=uniforms)
    if k and not bool(((proposals >= 0) & (proposals < vocab)).all()):
        raise ValueError(f"{name}: `proposals` holds a token ID outside [0, {vocab})")
    if backend(device) == "triton":
        return triton_kernels().rj.rejection_step_triton(target_probs, draft_probs, proposals, uniforms)
    return rj.rejection_step_reference(target_probs, draft_probs, proposals, uniforms)


def draw(probs: torch.Tensor, u: float) -> torch.Tensor:
    """probs [V] and a uniform in [0, 1) -> a 0-d int64 token: the one inverse-CDF draw every non-greedy token takes.

    It is the rejection step with no proposals (its bonus draw from `probs` with u in the SAMPLE lane), so a plain
    token and a speculative round's bonus or correction token round the same way.
    """
    probs = _tensor("draw", "probs", probs, ndim=1, dtypes=PROBS)
    uniforms = torch.zeros(1, rj.LANES, dtype=torch.float64, device=probs.device)
    uniforms[0, rj.SAMPLE] = u
    no_proposals = torch.zeros(0, dtype=torch.int64, device=probs.device)
    _, token = rejection_step(probs[None], probs.new_zeros(0, probs.numel()), no_proposals, uniforms)
    return token


def qmatmul(x: torch.Tensor, weight: torch.Tensor, qtype: str) -> torch.Tensor:
    """x [M, K] @ dequant(weight).T -> [M, N] float32, batch-invariant: a row's result ignores its neighbours.

    `weight` is the GGUF tensor's raw rows, [N, row_bytes] uint8, of logical shape [N, K].
    """
    x = _tensor("qmatmul", "x", x, ndim=2, dtypes=FLOATS)
    weight = _tensor("qmatmul", "weight", weight, ndim=2, dtypes=(torch.uint8,))
    if qtype not in qm.SUPPORTED:
        raise ValueError(f"qmatmul: `qtype` {qtype!r} is not supported; expected one of {', '.join(qm.SUPPORTED)}")
    rows, inner = x.shape
    _nonempty("qmatmul", "x", rows, "row")
    _nonempty("qmatmul", "weight", weight.shape[0], "row")
    per_block, block_bytes = dequant.BLOCK_LAYOUT[qtype]
    step = qm.step_size(qtype)  # a quant block, or the 32 weights the product reads F16 in
    if inner % step:
        raise ValueError(f"qmatmul: `x` has {inner} columns, not a multiple of {qtype}'s block of {step}")
    row_bytes = inner // per_block * block_bytes
    if weight.shape[1] != row_bytes:
        raise ValueError(
            f"qmatmul: `weight` rows hold {weight.shape[1]} bytes; "
            f"{qtype} rows of {inner} weights (x's columns) need {row_bytes}"
        )
    device = _same_device("qmatmul", x=x, weight=weight)
    if backend(device) == "triton":
        return triton_kernels().qm.qmatmul_triton(x, weight, qtype)
    return qm.qmatmul_reference(x, weight, qtype)


def fr_argmax(hidden: torch.Tensor, head_weight: torch.Tensor, n_prefix: int) -> torch.Tensor:
    """argmax over the first `n_prefix` vocabulary rows of hidden [M, d] @ head_weight[V, d].T -> ids [M] int64."""
    hidden = _tensor("fr_argmax", "hidden", hidden, ndim=2, dtypes=FLOATS)
    head_weight = _tensor("fr_argmax", "head_weight", head_weight, ndim=2, dtypes=FLOATS)
    rows, width = hidden.shape
    vocab, head_width = head_weight.shape
    _nonempty("fr_argmax", "hidden", rows, "row")
    if width != head_width:
        raise ValueError(f"fr_argmax: `hidden` is {width} wide but `head_weight` rows are {head_width} wide")
    if not 1 <= n_prefix <= vocab:
        raise ValueError(f"fr_argmax: `n_prefix` is {n_prefix}; expected 1 <= n_prefix <= {vocab} (the head's rows)")
    device = _same_device("fr_argmax", hidden=hidden, head_weight=head_weight)
    if backend(device) == "triton":
        return triton_kernels().fr.fr_argmax_triton(hidden, head_weight, n_prefix)
    return fr.fr_argmax_reference(hidden, head_weight, n_prefix)
