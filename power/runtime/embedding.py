"""The token embedding: a lookup dequantises only the rows it needs, from one copy of the weights.

Gemma 3 270M's embedding is 262,144 x 640 Q8_0 (178 MB in the file, 671 MB as
float32) and its LM head is tied to it. A tied embedding holds nothing of its
own: it reads its rows from the LM head as the head holds them (the CPU kernels'
tile layout, the GPU's GGUF rows, or the float32 reference's matrix,
`power.runtime.linear.Linear.rows`). An untied one keeps its GGUF rows, a copy
of its own. Dequantisation is exact and per block, so a row looked up either way
is the same bits as the row of the whole dequantised matrix.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from power.kernels import dispatch
from power.runtime.gguf_weights import GGUFFile
from power.runtime.linear import Linear


class TokenEmbedding:
    """`token_embd.weight` [vocab, d]: call it on token ids [m] -> [m, d] float32; `nbytes` is what it holds."""

    def __init__(self, rows: Callable[[torch.Tensor], torch.Tensor], shape: tuple[int, int], nbytes: int,
                 head: Linear | None = None) -> None:
        self._rows, self.shape, self.nbytes, self._head = rows, shape, nbytes, head

    @classmethod
    def of_gguf(cls, gguf: GGUFFile, name: str, shape: Sequence[int], device: str = "cpu") -> TokenEmbedding:
        """The tensor's GGUF rows on `device`, in the buffer the verified read filled (moved there when not the CPU)."""
        info = gguf.expect(name, shape)
        vocab, width = int(shape[0]), int(shape[1])
        table = gguf.raw(name).to(device).view(vocab, -1)  # [vocab, row_bytes] uint8

        def rows(tokens: torch.Tensor) -> torch.Tensor:
            picked = table[tokens]
            return dispatch.dequantize(info.qtype, picked.reshape(-1), (picked.shape[0], width))

        return cls(rows, (vocab, width), table.numel())

    @classmethod
    def tied(cls, head: Linear) -> TokenEmbedding:
        """The rows of the LM head it is tied to, read where the head holds them: nothing held twice."""
        return cls(head.rows, head.shape, 0, head)

    def tied_to(self, head: Linear) -> bool:
        """Whether it reads its rows from `head` (which a trunk that holds its head anew must then tie it to)."""
        return self._head is head

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._rows(tokens)
