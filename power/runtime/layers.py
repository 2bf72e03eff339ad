"""Building blocks every trunk shares: norms, rotary embeddings, masked attention over explicit keys, MLPs.

Everything here is row-independent: a row's result depends only on that row's
inputs (and the cache), never on how many rows run beside it. The elementwise
transcendental functions need one care for that to hold at any row count:
torch runs the last partial SIMD chunk of a tensor through a scalar path whose
exp / log may round differently from the vector path, so an op over a narrow
row ([n, 4] gate values) runs through `aligned`; the trunks' wide rows (model,
FFN and head widths, multiples of SIMD_WIDTH) are whole vectors already.

Shapes: n = rows in the forward, d = model width, H / Hkv = query / key-value
heads, hd = head width, T = cache capacity in positions.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from power.kernels import dispatch
from power.kernels.cpu import rowops
from power.runtime.linear import Linear

SIMD_WIDTH = 64  # floats: two AVX-512 vectors, a whole number of AVX2 ones


def aligned(op: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """An elementwise `op` on rows x [n, w], each row padded to a multiple of SIMD_WIDTH so every element takes the
    vector path: a row's bits are then the same whatever the number of rows (measured: a qwen35 fixture row's gates,
    [n, 4], changed between 1 and 8 rows without it)."""
    n, width = x.shape
    padded = x.new_zeros(n, -(-width // SIMD_WIDTH) * SIMD_WIDTH)
    padded[:, :width] = x
    return op(padded)[:, :width]


def linear(x: torch.Tensor, weight: torch.Tensor | Linear) -> torch.Tensor:
    """x [n, in] (float32) @ weight[out, in].T -> [n, out] float32; the matmul runs in the weight's dtype, or as a
    packed `Linear` (a drafter's matrix in its GGUF blocks) multiplies."""
    if isinstance(weight, Linear):
        return weight(x.float().contiguous())
    return F.linear(x.to(weight.dtype), weight).to(torch.float32)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """[..., d] -> [..., d]: x / sqrt(mean(x^2) + eps) * weight (llama.cpp `ggml_rms_norm` then `ggml_mul`).

    `weight` is [d], or [..., d] broadcasting over x (e.g. one row per head). On the CPU (outside autograd) this
    is `power.kernels.cpu.rowops.rms_norm`, whose rows are the same bits at any row count by construction."""
    if _on_cpu_kernels(x, weight) and tuple(weight.shape) == tuple(x.shape[x.dim() - weight.dim():]):
        return rowops.rms_norm(x, weight, eps)
    if x.dtype != weight.dtype and torch.is_autocast_enabled("cpu"):  # bfloat16 products in training: a float32 norm
        x = x.float()
    if weight.dim() == 1:
        return F.rms_norm(x, weight.shape, weight, eps)
    return F.rms_norm(x, x.shape[-1:], eps=eps) * weight


def l2_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """[..., d] -> x / sqrt(sum(x^2) + eps) over the last dimension."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


class Norm:
    """A norm over each row's last dimension: RMS (`rms_norm`, times `weight`) or, without a weight, L2 (`l2_norm`).

    On the GPU path (`kernels`) through `power.kernels.dispatch.rms_norm`: one program per row, so a row's bits do not
    depend on the number of rows (torch's CUDA reductions pick their thread layout from it; `power.kernels.norm`).
    """

    def __init__(self, weight: torch.Tensor | None, eps: float, kernels: bool) -> None:
        self.weight, self.eps, self.kernels = weight, eps, kernels

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels:
            return dispatch.rms_norm(x.contiguous(), self.weight, self.eps, mean=self.weight is not None)
        return l2_norm(x, self.eps) if self.weight is None else rms_norm(x, self.weight, self.eps)


def rope_tables(positions: int, dim: int, base: float, scale: float = 1.0,
                device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [positions, dim // 2] for rotary embeddings; `scale` divides positions (linear rope scaling).

    Computed in float64 on the CPU, so every device gets the same tables."""
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # [dim/2]
    angles = torch.outer(torch.arange(positions, dtype=torch.float64) / scale, inv_freq)
    return angles.cos().to(device, torch.float32), angles.sin().to(device, torch.float32)


def rope_rows(tables: tuple[torch.Tensor, torch.Tensor],
              positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The (cos, sin) rows of `rope_tables` at `positions`."""
    cos, sin = tables
    return cos[positions], sin[positions]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
    """x [n, heads, hd], cos/sin [n, hd/2] -> rotated x.

    NEOX style rotates the two halves of a head (Gemma, Qwen); the original
    (GPT-J/llama.cpp `LLAMA_ROPE_TYPE_NORM`) style rotates adjacent pairs. On the CPU (outside autograd)
    `power.kernels.cpu.rowops.rope`, elsewhere its torch reference: the same bits.
    """
    if _on_cpu_kernels(x, cos, sin):
        return rowops.rope(x, cos, sin, neox)
    return rowops.reference_rope(x, cos, sin, neox)


def _on_cpu_kernels(x: torch.Tensor, *operands: torch.Tensor) -> bool:
    """Whether the CPU row kernels take x: float32 on the CPU and no gradient to carry into x or any other operand
    (training uses torch's ops: the kernels have no backward)."""
    carries = torch.is_grad_enabled() and any(t.requires_grad for t in (x, *operands))
    return x.device.type == "cpu" and x.dtype == torch.float32 and not carries


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: torch.Tensor,
              scale: float) -> torch.Tensor:
    """q [n, H, hd] against explicit keys/values [Hkv, T, hd] under `mask` [n, T] -> [n, H * hd_v].

    For a drafter's own keys; the trunks attend to their caches through `KVCache.attend_rows` (CPU) or the GPU
    path's kernels.
    """
    n, n_heads, head_dim = q.shape
    n_kv = k_cache.shape[0]
    group = n_heads // n_kv
    q = q.permute(1, 0, 2).reshape(n_kv, group * n, head_dim)  # [Hkv, G*n, hd]
    scores = torch.matmul(q, k_cache.transpose(1, 2)) * scale  # [Hkv, G*n, T]
    scores = scores.view(n_kv, group, n, -1) + mask  # [Hkv, G, n, T]
    probs = torch.softmax(scores, dim=-1).view(n_kv, group * n, -1)
    out = torch.matmul(probs, v_cache)  # [Hkv, G*n, hd_v]
    return out.view(n_heads, n, -1).permute(1, 0, 2).reshape(n, -1)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def gated_mlp(x: torch.Tensor, gate_up: Callable, down: Callable, act: Callable) -> torch.Tensor:
    """down(act(gate(x)) * up(x)), gate and up as one projection [n, 2 * d_ff] (gate first): SwiGLU with
    `F.silu`, GeGLU with `gelu_tanh`."""
    gate, up = gate_up(x).chunk(2, dim=-1)
    return down(act(gate) * up)


def softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    return logits if not cap else torch.tanh(logits / cap) * cap
