"""The token embedding, kept as its GGUF rows: a lookup dequantises only the rows it needs.

Gemma 3 270M's embedding is 262,144 x 640 Q8_0 (178 MB in the file, 671 MB as
float32) and its LM head is tied to it; holding the file's rows and
dequantising the few a forward looks up costs its file size and nothing more.
Dequantisation is exact and per block, so a row looked up this way is the same
bits as the row of the whole dequantised matrix.
"""

from __future__ import annotations

from typing import Sequence

import torch

from power.kernels import dispatch
from power.runtime.gguf_weights import GGUFFile


class TokenEmbedding:
    """`token_embd.weight` [vocab, d] as its GGUF rows on `device`; call it on token ids [m] -> [m, d] float32."""

    def __init__(self, gguf: GGUFFile, name: str, shape: Sequence[int], device: str = "cpu") -> None:
        info = gguf.expect(name, shape)
        self.qtype, self.shape = info.qtype, (int(shape[0]), int(shape[1]))
        self._rows = gguf.raw(name).to(device).view(self.shape[0], -1)  # [vocab, row_bytes] uint8

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        picked = self._rows[tokens]  # [m, row_bytes]
        return dispatch.dequantize(self.qtype, picked.reshape(-1), (picked.shape[0], self.shape[1]))

    @property
    def nbytes(self) -> int:
        return self._rows.numel()
