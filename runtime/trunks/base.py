"""What every trunk shares: the fixed-shape forward, chunked prefill, the LM head, rewind and checkpoints.

A concrete trunk implements `_run(tokens, start, n_real, taps)`: push a padded
block of rows through its layers, writing caches at [start, start + rows), and
return the final residual (before the output norm) plus the requested taps. This
class owns the shapes:

- `forward` pads its 1..verify_capacity rows to exactly `verify_capacity`;
- `prefill` runs the prompt in chunks of exactly `prefill_chunk` rows;
- the LM head always runs on blocks of exactly `verify_capacity` rows, unless
  its packing computes a row the same way at any row count (int8's exact
  integer products), when it runs on the real rows alone.

So a row's logits never depend on how many real rows ran beside it, and a
prompt's logits are the same whoever prefills it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from power.artifacts.gguf_reader import ArtifactError
from power.runtime.dtypes import WEIGHT_DTYPES
from power.runtime.errors import ContextOverflow, RuntimeInputError
from power.runtime.gguf_weights import GGUFFile
from power.runtime.layers import rms_norm, softcap
from power.runtime.linear import Linear, pack, pack_head
from power.runtime.trunks.protocol import ForwardOut, TrunkConfig

PAD_TOKEN = 0
DEFAULT_PREFILL_CHUNK = 32


@dataclass(frozen=True)
class TrunkOptions:
    """How to instantiate a trunk: capacity, fixed shapes and matmul dtype (the plan decides these)."""

    n_ctx: int
    verify_capacity: int
    snapshot_rows: int = 0
    dtype: str = "float32"
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    lm_head_dtype: str | None = None  # None: the same as `dtype`
    device: str = "cpu"  # where weights, caches and activations live ("cpu", "cuda", "cuda:1", ...)

    def __post_init__(self) -> None:
        for dtype in (self.dtype, self.head_dtype):
            if dtype not in WEIGHT_DTYPES:
                raise RuntimeInputError(f"weight dtype {dtype!r} is not supported (choose {', '.join(WEIGHT_DTYPES)})")
        if self.verify_capacity < 1 or self.n_ctx < 1 or self.prefill_chunk < 1:
            raise RuntimeInputError(f"n_ctx ({self.n_ctx}), verify_capacity ({self.verify_capacity}) and "
                                    f"prefill_chunk ({self.prefill_chunk}) must be positive")

    @property
    def head_dtype(self) -> str:
        """The LM head's weight dtype (the largest matrix of a small model: int8 halves what it reads)."""
        return self.lm_head_dtype or self.dtype

    @property
    def cache_capacity(self) -> int:
        """Context plus room for the padding rows of the largest forward shape."""
        return self.n_ctx + max(self.verify_capacity, self.prefill_chunk)


class ArchHeader:
    """A trunk's GGUF header under its architecture's key prefix, with the attention shape every trunk reads alike.

    An absent head_count_kv means one KV head per query head; absent key/value lengths mean d_model / head_count.
    The values' ranges were checked when the file was opened (`power.artifacts.header_values`); what is left
    here is the runtime's own limit: one value for every layer where a header may give one per layer.
    """

    def __init__(self, gguf: GGUFFile, arch: str) -> None:
        self.gguf, self.arch = gguf, arch
        self.d_model = int(self.require("embedding_length"))
        self.n_heads = self.uniform("attention.head_count", self.require("attention.head_count"))
        self.block_count = int(self.require("block_count"))
        self.d_ff = self.uniform("feed_forward_length", self.require("feed_forward_length"))
        self.n_kv_heads = self.uniform("attention.head_count_kv", self.get("attention.head_count_kv", self.n_heads))
        self.key_length = int(self.get("attention.key_length", self.d_model // self.n_heads))
        self.eps = float(self.require("attention.layer_norm_rms_epsilon"))

    def uniform(self, name: str, value: Any) -> int:
        """A value the header may give per layer, which the runtime's trunks take as one for all layers."""
        if isinstance(value, list):
            raise ArtifactError(f"{self.arch}.{name} differs per layer ({len(value)} values); the Power runtime's "
                                f"{self.arch} trunk takes one value for every layer", code="PWR120",
                                file=str(self.gguf.path), hint="render the plan for llama-server instead")
        return int(value)

    @property
    def value_length(self) -> int:
        return int(self.get("attention.value_length", self.d_model // self.n_heads))

    @property
    def vocab(self) -> int:
        return self.gguf.info("token_embd.weight").shape[0]

    def require(self, name: str) -> Any:
        return self.gguf.require(f"{self.arch}.{name}")

    def get(self, name: str, default: Any = None) -> Any:
        return self.gguf.get(f"{self.arch}.{name}", default)


class Weights:
    """Reads a trunk's tensors from its GGUF: matrices packed for the matmul (`power.runtime.linear`), vectors in float32.

    `rows` is the forward shape the matrices are laid out for (the verification capacity).
    """

    def __init__(self, gguf: GGUFFile, dtype: str, rows: int, device: str = "cpu") -> None:
        self.gguf, self.dtype, self.rows, self.device = gguf, dtype, rows, device

    def matrix(self, name: str, shape: Sequence[int]) -> Linear:
        return pack(self.tensor(name, shape), self.dtype, self.rows)

    def lm_head(self, dtype: str, shape: Sequence[int]) -> Linear:
        """`output.weight` [vocab, d], or the token embedding when the output is tied to it, packed as an LM head."""
        name = "output.weight" if self.gguf.has("output.weight") else "token_embd.weight"
        return pack_head(self.tensor(name, shape), dtype, self.rows)

    def fused(self, *matrices: tuple[str, Sequence[int]]) -> Linear:
        """One matmul for several matrices that read the same input: their outputs side by side, in order."""
        return pack(torch.cat([self.tensor(name, shape) for name, shape in matrices]), self.dtype, self.rows)

    def tensor(self, name: str, shape: Sequence[int]) -> torch.Tensor:
        """A float32 tensor on the trunk's device (embeddings, vectors, and matrices before packing)."""
        return self.gguf.tensor(name, shape, self.device)

    def optional_tensor(self, name: str, shape: Sequence[int]) -> torch.Tensor | None:
        return self.tensor(name, shape) if self.gguf.has(name) else None


class FixedShapeTrunk:
    """The trunk contract (`power.runtime.trunks.protocol.Trunk`) over a concrete `_run`."""

    config: TrunkConfig

    def __init__(self, config: TrunkConfig, options: TrunkOptions, output_norm: torch.Tensor,
                 output: Linear, norm_eps: float, logit_softcap: float | None = None) -> None:
        self.config, self.options = config, options
        self._output_norm, self._output, self._norm_eps = output_norm, output, norm_eps
        self._logit_softcap = logit_softcap
        self._position = 0

    # --- the contract -------------------------------------------------------

    @property
    def position(self) -> int:
        return self._position

    def forward(self, tokens: Sequence[int], taps: Sequence[int] = ()) -> ForwardOut:
        n = len(tokens)
        capacity = self.config.verify_capacity
        if not 1 <= n <= capacity:
            raise ValueError(f"a forward takes 1..{capacity} rows (the verification capacity), got {n}")
        self._check_room(n)
        final, tapped = self._run(self._padded(tokens, capacity), self._position, n, taps)
        self._position += n
        return ForwardOut(logits=self.logits(final[:n]), hidden={layer: h[:n] for layer, h in tapped.items()})

    def prefill(self, tokens: Sequence[int], taps: Sequence[int] = (), all_logits: bool = False) -> ForwardOut:
        """Append a prompt in fixed `prefill_chunk` chunks; logits of the last row, or of every row with `all_logits`."""
        if not tokens:
            raise ValueError("prefill needs at least one token")
        self._check_room(len(tokens))
        chunk = self.options.prefill_chunk
        finals, tapped_chunks = [], []
        for begin in range(0, len(tokens), chunk):
            part = tokens[begin:begin + chunk]
            final, tapped = self._run(self._padded(part, chunk), self._position, len(part), taps)
            self._position += len(part)
            finals.append(final[:len(part)])
            tapped_chunks.append({layer: h[:len(part)] for layer, h in tapped.items()})
        final = torch.cat(finals)
        hidden = {layer: torch.cat([t[layer] for t in tapped_chunks]) for layer in taps}
        return ForwardOut(logits=self.logits(final if all_logits else final[-1:]), hidden=hidden)

    def rewind(self, length: int) -> None:
        if not 0 <= length <= self._position:
            raise ValueError(f"rewind to {length} is outside the committed range [0, {self._position}]")
        self._rewind_state(length)
        self._position = length

    def checkpoint(self) -> Any:
        return (self._position, self._state_checkpoint())

    def restore(self, checkpoint: Any) -> None:
        position, state = checkpoint
        self._restore_state(state)
        self._position = position

    def reset(self) -> None:
        self._reset_state()
        self._position = 0

    # --- the LM head ----------------------------------------------------------

    @property
    def lm_head(self) -> Linear:
        """The output projection [vocab, d], packed in the matmul dtype."""
        return self._output

    def logits(self, final: torch.Tensor) -> torch.Tensor:
        """final residual rows [m, d] -> logits [m, vocab], the head run on blocks of exactly verify_capacity rows
        (or on the m rows alone when its rows are the same at any row count, as an int8 head's are)."""
        capacity = self.config.verify_capacity
        normed = rms_norm(final, self._output_norm, self._norm_eps)
        if self._output.row_count_invariant:
            return softcap(self._output(normed), self._logit_softcap)
        blocks = []
        for begin in range(0, normed.shape[0], capacity):
            rows = normed[begin:begin + capacity]
            padded = torch.cat((rows, rows.new_zeros(capacity - rows.shape[0], rows.shape[1])))
            blocks.append(self._output(padded)[:rows.shape[0]])
        return softcap(torch.cat(blocks), self._logit_softcap)

    # --- for concrete trunks ------------------------------------------------

    def _run(self, tokens: torch.Tensor, start: int, n_real: int,
             taps: Sequence[int]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """tokens [m] (padded) at positions [start, start + m) -> final residual [m, d], taps {layer: [m, d]}."""
        raise NotImplementedError

    def _rewind_state(self, length: int) -> None:
        """Attention-only trunks have nothing to do: slots past `length` are masked."""

    def _state_checkpoint(self) -> Any:
        return None

    def _restore_state(self, state: Any) -> None:
        """Attention-only trunks keep no state beyond the position."""

    def _reset_state(self) -> None:
        """Attention-only trunks keep no state beyond the position."""

    # --- helpers -------------------------------------------------------------

    def _check_room(self, n: int) -> None:
        if self._position + n > self.config.n_ctx:
            raise ContextOverflow(f"{self._position + n} positions do not fit the context of {self.config.n_ctx} "
                                  f"({self._position} in the cache + {n} new); raise the plan's ctx or shorten the prompt")

    def _padded(self, tokens: Sequence[int], rows: int) -> torch.Tensor:
        return torch.tensor(list(tokens) + [PAD_TOKEN] * (rows - len(tokens)), dtype=torch.long,
                            device=self.options.device)

    def _positions(self, start: int, rows: int) -> torch.Tensor:
        return torch.arange(start, start + rows, device=self.options.device)

