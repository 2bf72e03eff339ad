"""The dispatch point of the Triton kernels: every call of one in the runtime goes through here.

The CPU kernels (`power.kernels.cpu`: C++ products with GGUF matrices kept in their blocks, row norms, rope and
attention) are the other entry point, called directly: they hold weights in a tile layout of their own, reordered
once at load (`QuantMatrix`), and run the CPU's instruction path chosen at load, with no second backend to pick
per call (docs/kernels.md, "Two entry points").

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

from power.kernels import attention as at
from power.kernels import dequant, interpreter
from power.kernels import fr_argmax as fr
from power.kernels import greedy_verify as gv
from power.kernels import norm as nm
from power.kernels import qmatmul as qm
from power.kernels import rejection as rj

BACKENDS = ("auto", "triton", "reference")
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
PROBS = (torch.float32, torch.float64)
CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # the KV types the GPU path's caches hold
INTEGERS = (torch.int64, torch.int32)


@functools.cache
def triton_kernels() -> SimpleNamespace:
    """The Triton kernels, imported on first use: a run on the references never loads Triton (about 70 MiB of
    resident memory). Under Triton's interpreter its row-invariant dot is installed first (`interpreter`)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        interpreter.install()
    from power.kernels import (
        attention_triton,
        dequant_triton,
        fr_argmax_triton,
        greedy_verify_triton,
        norm_triton,
        qmatmul_triton,
        rejection_triton,
    )

    return SimpleNamespace(at=attention_triton, dequant=dequant_triton, fr=fr_argmax_triton, gv=greedy_verify_triton,
                           nm=norm_triton, qm=qmatmul_triton, rj=rejection_triton)


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
        raise dequant.UnsupportedQuantType(f"dequantize: `qtype` {qtype!r} is not supported; "
                                           f"expected one of {supported}")
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


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, *, mean: bool = True) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over each row of x [..., d] (`mean=False`: the L2 norm, sum instead of
    mean); `weight` None, [d], or [..., d] matching x's trailing dimensions (one row per head, repeated over the
    leading ones). Row-count invariant: a row's result ignores the other rows and how many there are."""
    x = _tensor("rms_norm", "x", x, ndim=_rank(x), dtypes=(torch.float32,))
    _nonempty("rms_norm", "x", x.dim() and x.shape[-1], "column")
    if weight is not None:
        weight = _tensor("rms_norm", "weight", weight, ndim=_rank(weight), dtypes=(torch.float32,))
        if not 1 <= weight.dim() <= x.dim() or tuple(weight.shape) != tuple(x.shape[x.dim() - weight.dim():]):
            raise ValueError(f"rms_norm: `weight` has shape {tuple(weight.shape)}; expected x's trailing dimensions "
                             f"(e.g. ({x.shape[-1]},)) for x of shape {tuple(x.shape)}")
        _same_device("rms_norm", x=x, weight=weight)
    if backend(x.device) == "triton":
        return triton_kernels().nm.rms_norm_triton(x, weight, eps, mean)
    return nm.rms_norm_reference(x, weight, eps, mean)


def _rank(value: object) -> int:
    """A tensor's own rank (any rank is accepted where this is the expected one), for `_tensor`'s other checks."""
    return value.dim() if isinstance(value, torch.Tensor) else 1


def _rows_of_slots(kernel: str, slots: torch.Tensor, positions: torch.Tensor, rows: int) -> None:
    """Per-row slot and position vectors. Their values are not read here: that would wait for the device, which a
    captured CUDA graph cannot; the runtime builds them from positions it has checked against the context."""
    for name, value in (("slots", slots), ("positions", positions)):
        _tensor(kernel, name, value, ndim=1, dtypes=(torch.int64,))
        if value.numel() != rows:
            raise ValueError(f"{kernel}: `{name}` has {value.numel()} entries; expected one per row ({rows})")


def _caches(kernel: str, k_cache: torch.Tensor, v_cache: torch.Tensor, n_kv: int | None,
            head_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One attention layer's caches, [slots, Hkv, capacity, d] each, of one of CACHE_DTYPES (a row is rounded to it
    as it is written and read back exactly), with `n_kv` KV heads (None: any) of width `head_k` for the keys."""
    k_cache = _tensor(kernel, "k_cache", k_cache, ndim=4, dtypes=CACHE_DTYPES)
    v_cache = _tensor(kernel, "v_cache", v_cache, ndim=4, dtypes=(k_cache.dtype,))
    slots, heads, capacity, width = k_cache.shape
    if (n_kv is not None and heads != n_kv) or width != head_k or tuple(v_cache.shape[:3]) != (slots, heads, capacity):
        raise ValueError(f"{kernel}: caches have shapes {tuple(k_cache.shape)} and {tuple(v_cache.shape)}; expected "
                         f"[slots, {n_kv if n_kv is not None else 'Hkv'}, capacity, {head_k}] and the same "
                         "[slots, Hkv, capacity] for the values")
    return k_cache, v_cache


def cache_write(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                positions: torch.Tensor) -> None:
    """Store k [n, Hkv, dk] and v [n, Hkv, dv] in k_cache/v_cache [S, Hkv, T, d] at row i's (slots[i], positions[i]);
    a padding row (slot -1) writes nothing."""
    k = _tensor("cache_write", "k", k, ndim=3, dtypes=(torch.float32,))
    v = _tensor("cache_write", "v", v, ndim=3, dtypes=(torch.float32,))
    rows, n_kv, head_k = k.shape
    k_cache, v_cache = _caches("cache_write", k_cache, v_cache, n_kv, head_k)
    if tuple(v.shape) != (rows, n_kv, v_cache.shape[3]):
        raise ValueError(f"cache_write: `v` has shape {tuple(v.shape)}; expected ({rows}, {n_kv}, {v_cache.shape[3]})")
    _rows_of_slots("cache_write", slots, positions, rows)
    device = _same_device("cache_write", k=k, v=v, k_cache=k_cache, v_cache=v_cache, slots=slots, positions=positions)
    k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)  # each row rounded to the cache's type by torch (to nearest even)
    if backend(device) == "triton":
        triton_kernels().at.cache_write_triton(k, v, k_cache, v_cache, slots, positions)
    else:
        at.cache_write_reference(k, v, k_cache, v_cache, slots, positions)


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
              positions: torch.Tensor, scale: float, window: int = 0) -> torch.Tensor:
    """Each query row of q [n, H, dk] against its slot's cache rows j <= position (and position - j < window when
    window > 0) of k_cache [S, Hkv, T, dk] / v_cache [S, Hkv, T, dv], query head h on KV head h // (H / Hkv)
    -> [n, H * dv] float32; a padding row (slot -1) gives zeros. Row-count invariant (`power.kernels.attention`)."""
    q = _tensor("attention", "q", q, ndim=3, dtypes=(torch.float32,))
    rows, n_heads, head_k = q.shape
    _nonempty("attention", "q", rows, "row")
    k_cache, v_cache = _caches("attention", k_cache, v_cache, None, head_k)
    n_kv = k_cache.shape[1]
    if n_kv < 1 or n_heads % n_kv:
        raise ValueError(f"attention: `q` has {n_heads} heads, not a multiple of the caches' {n_kv} KV heads")
    _rows_of_slots("attention", slots, positions, rows)
    if window < 0:
        raise ValueError(f"attention: `window` is {window}; expected 0 (a global layer) or a positive width")
    device = _same_device("attention", q=q, k_cache=k_cache, v_cache=v_cache, slots=slots, positions=positions)
    if backend(device) == "triton":
        return triton_kernels().at.attention_triton(q, k_cache, v_cache, slots, positions, scale, window)
    return at.attention_reference(q, k_cache, v_cache, slots, positions, scale, window)
