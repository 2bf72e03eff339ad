"""The real Gemma 3 270M against an independent float64 re-implementation, and its greedy text.

The reference below is written plainly from llama.cpp's `llm_build_gemma3`:
numpy float64 throughout, weights dequantised by `gguf.quants` (not ours), tensor
offsets from the orchestrator's header reader. It shares no code with the trunk.

Tolerance (documented in docs/runtime.md): the float32 trunk's logits stay
within 2e-2 of float64 (logits range over roughly +-40; the measured worst case
is a few 1e-3) and every row's top-1 token is identical.
"""

from __future__ import annotations

import dataclasses
import functools

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize
from gguf_helpers import gemma

from power.artifacts.gguf_reader import read_header
from power.documents.arithmetic import ARITHMETICS, FLOAT32
from power.runtime.engine import Engine
from power.runtime.workload import Workload

pytestmark = pytest.mark.slow  # outside `scripts/test --fast`: interpreter-heavy or runs the real model for long

PROMPT_IDS = [2, 50429, 563, 506, 5279, 529]  # "<bos>Paris is the capital of"
LOGIT_TOLERANCE = 2e-2


class Float64Gemma:
    def __init__(self, path):
        header = read_header(path)
        data = np.memmap(path, dtype=np.uint8, mode="r")
        self.meta = header.metadata
        self.tensors = {t.name: (t, header.data_offset + t.offset) for t in header.tensors}
        self.data = data

    def w(self, name: str) -> np.ndarray:
        info, offset = self.tensors[name]
        raw = np.array(self.data[offset:offset + info.nbytes])
        values = dequantize(raw, gguf.GGMLQuantizationType(info.ggml_type))
        return values.reshape(info.shape).astype(np.float64)

    def logits(self, ids: list[int], last: int | None = None) -> np.ndarray:
        """Logits of every row, or of the `last` rows only."""
        m = self.meta
        d, n_layers = m["gemma3.embedding_length"], m["gemma3.block_count"]
        n_head, n_kv, hd = (
            m["gemma3.attention.head_count"],
            m["gemma3.attention.head_count_kv"],
            m["gemma3.attention.key_length"],
        )
        eps, window = m["gemma3.attention.layer_norm_rms_epsilon"], m["gemma3.attention.sliding_window"]
        embedding = self.w("token_embd.weight")
        n = len(ids)
        h = embedding[ids] * np.sqrt(d)
        positions = np.arange(n)
        for layer in range(n_layers):
            is_global = layer % 6 == 5
            base = m["gemma3.rope.freq_base"] if is_global else 10_000.0
            p = f"blk.{layer}."
            x = rms(h, self.w(p + "attn_norm.weight"), eps)
            q = (x @ self.w(p + "attn_q.weight").T).reshape(n, n_head, hd)
            k = (x @ self.w(p + "attn_k.weight").T).reshape(n, n_kv, hd)
            v = (x @ self.w(p + "attn_v.weight").T).reshape(n, n_kv, hd)
            q = rope_neox(rms(q, self.w(p + "attn_q_norm.weight"), eps), positions, base)
            k = rope_neox(rms(k, self.w(p + "attn_k_norm.weight"), eps), positions, base)
            out = np.zeros((n, n_head, hd))
            for head in range(n_head):
                kv = head // (n_head // n_kv)
                scores = q[:, head] @ k[:, kv].T / np.sqrt(hd)
                visible = positions[None, :] <= positions[:, None]
                if not is_global:
                    visible &= positions[:, None] - positions[None, :] < window
                scores = np.where(visible, scores, -np.inf)
                weights = np.exp(scores - scores.max(-1, keepdims=True))
                out[:, head] = (weights / weights.sum(-1, keepdims=True)) @ v[:, kv]
            attn = out.reshape(n, -1) @ self.w(p + "attn_output.weight").T
            h = h + rms(attn, self.w(p + "post_attention_norm.weight"), eps)
            x = rms(h, self.w(p + "ffn_norm.weight"), eps)
            ffn = (gelu_tanh(x @ self.w(p + "ffn_gate.weight").T) * (x @ self.w(p + "ffn_up.weight").T)) @ self.w(
                p + "ffn_down.weight"
            ).T
            h = h + rms(ffn, self.w(p + "post_ffw_norm.weight"), eps)
        return rms(h[-(last or n):], self.w("output_norm.weight"), eps) @ embedding.T


def rms(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


def rope_neox(x: np.ndarray, positions: np.ndarray, base: float) -> np.ndarray:
    half = x.shape[-1] // 2
    angles = positions[:, None] * base ** (-np.arange(half) * 2.0 / x.shape[-1])  # [n, half]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


@functools.cache
def engine(arithmetic: str = FLOAT32) -> Engine:
    """Gemma in `arithmetic` (the float32 reference unless named; a plan-less run is quantised), its KV caches in f32
    (a plan-less run holds them in f16, a default plan's type): what is measured here is the arithmetic."""
    workload = Workload.of_gguf(gemma(), ctx=600)
    return Engine(dataclasses.replace(workload, runtime=workload.runtime.model_copy(
        update={"arithmetic": arithmetic, "kv_cache_type": "f32", "draft_kv_cache_type": "f32"})))


def test_float32_trunk_logits_agree_with_the_float64_reference():
    expected = Float64Gemma(gemma()).logits(PROMPT_IDS)
    model = engine().trunk
    model.reset()
    actual = model.prefill(PROMPT_IDS, all_logits=True).logits.double().numpy()
    assert actual.shape == expected.shape == (len(PROMPT_IDS), 262_144)
    assert np.abs(actual - expected).max() < LOGIT_TOLERANCE
    assert (actual.argmax(-1) == expected.argmax(-1)).all()


@pytest.mark.slow
def test_past_the_sliding_window_the_last_row_agrees_with_the_float64_reference():
    """540 positions: the local layers see only the last 512, the global ones everything.

    Ignoring the window moves this row's float64 logits by up to 2.7, far past the tolerance.
    """
    ids = engine().tokenizer.encode("The quick brown fox jumps over the lazy dog near the river bank. " * 45)[:540]
    assert len(ids) == 540
    expected = Float64Gemma(gemma()).logits(ids, last=1)
    model = engine().trunk
    model.reset()
    actual = model.prefill(ids).logits.double().numpy()
    assert np.abs(actual - expected).max() < LOGIT_TOLERANCE
    assert actual.argmax(-1) == expected.argmax(-1)


def test_the_prompt_ids_are_what_the_tokenizer_makes():
    assert engine().tokenizer.encode("Paris is the capital of") == PROMPT_IDS


@pytest.mark.parametrize("arithmetic", ARITHMETICS)
@pytest.mark.parametrize("prompt,expected", [
    ("Paris is the capital of", " France"),
    ("1, 2, 3, 4, 5,", " 6, 7, 8,"),
    ("Once upon a time", ", there was a"),
])
def test_greedy_continuations_are_coherent(prompt, expected, arithmetic):
    receipt = engine(arithmetic).generate(prompt, 10)
    assert expected in receipt.text
    assert receipt.stop_reason == "length" and len(receipt.token_ids) == 10
