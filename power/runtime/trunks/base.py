"""What every trunk shares: the fixed-shape forward, chunked prefill, the LM head, rewind and checkpoints.

A trunk holds `slots` sequences side by side. A concrete trunk implements
`_run(tokens, batch, taps)`: push a padded block of rows through its layers,
writing each segment's cache rows (and recurrent state) in its own slot
(`power.runtime.trunks.batch`), and return the final residual (before the
output norm) plus the requested taps. This class owns the shapes:

- `forward` / `forward_parts` pad their 1..verify_capacity rows (of one or
  several sequences) to exactly `verify_capacity`;
- `prefill` / `prefill_parts` run prompts in chunks of exactly `prefill_chunk`
  rows, each chunk covering positions [j * chunk, (j + 1) * chunk) of its
  sequence;
- the LM head always runs on blocks of exactly `verify_capacity` rows, unless
  its packing computes a row the same way at any row count (int8's exact
  integer products), when it runs on the real rows alone.

So a row's logits never depend on how many real rows ran beside it or whose
they were, and a prompt's logits are the same whoever prefills it, in one go or
piece by piece, alone or beside other sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from power.artifacts.gguf_reader import ArtifactError
from power.documents.dtypes import WEIGHT_DTYPES
from power.runtime.errors import ContextOverflow, RuntimeInputError
from power.runtime.gguf_weights import GGUFFile
from power.runtime.kv_cache import KVCache
from power.runtime.layers import rms_norm, softcap
from power.runtime.linear import Linear, pack, pack_head
from power.runtime.trunks.batch import RowBatch, Segment
from power.runtime.trunks.protocol import ForwardOut, TrunkConfig

PAD_TOKEN = 0
DEFAULT_PREFILL_CHUNK = 32


@dataclass(frozen=True)
class TrunkOptions:
    """How to instantiate a trunk: capacity, fixed shapes and matmul dtype (the plan decides these).

    `n_ctx` is one sequence's context; the trunk holds `slots` sequences, each with a cache region of its own.
    """

    n_ctx: int
    verify_capacity: int
    snapshot_rows: int = 0
    dtype: str = "float32"
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    lm_head_dtype: str | None = None  # None: the same as `dtype`
    device: str = "cpu"  # where weights, caches and activations live ("cpu", "cuda", "cuda:1", ...)
    slots: int = 1  # sequences decoded side by side

    def __post_init__(self) -> None:
        for dtype in (self.dtype, self.head_dtype):
            if dtype not in WEIGHT_DTYPES:
                raise RuntimeInputError(f"weight dtype {dtype!r} is not supported (choose {', '.join(WEIGHT_DTYPES)})")
        if self.verify_capacity < 1 or self.n_ctx < 1 or self.prefill_chunk < 1 or self.slots < 1:
            raise RuntimeInputError(f"n_ctx ({self.n_ctx}), verify_capacity ({self.verify_capacity}), "
                                    f"prefill_chunk ({self.prefill_chunk}) and slots ({self.slots}) must be positive")

    @property
    def head_dtype(self) -> str:
        """The LM head's weight dtype (the largest matrix of a small model: int8 halves what it reads)."""
        return self.lm_head_dtype or self.dtype

    @property
    def cache_capacity(self) -> int:
        """One slot's context plus room for the padding rows of the largest forward shape."""
        return self.n_ctx + max(self.verify_capacity, self.prefill_chunk)


def slot_caches(options: TrunkOptions, n_kv_heads: int, head_dim_k: int, head_dim_v: int) -> list[KVCache]:
    """One attention layer's caches: a region of `cache_capacity` positions for each slot."""
    return [KVCache(n_kv_heads, options.cache_capacity, head_dim_k, head_dim_v, options.device)
            for _ in range(options.slots)]


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


@dataclass(frozen=True)
class Part:
    """One sequence's rows in a shared forward: its slot, its tokens, and how many of its last rows need logits
    (None: every row; the LM head is the dearest part of a row, so a prefill chunk asks for its last row at most)."""

    slot: int
    tokens: Sequence[int]
    logit_rows: int | None = None

    @property
    def wanted(self) -> int:
        return len(self.tokens) if self.logit_rows is None else self.logit_rows


class FixedShapeTrunk:
    """The trunk contract (`power.runtime.trunks.protocol.Trunk`) over a concrete `_run`, for `options.slots`
    sequences at once.

    Each slot is one sequence with its own cache region, position and (for a recurrent trunk) state. The
    contract's methods act on one slot (`slot=0` unless given); `sequence(slot)` is that slot as a `Trunk`.
    `forward_parts` and `prefill_parts` run several slots' rows in one fixed-shape forward
    (`power.runtime.trunks.batch`), each row computed exactly as in a forward of its slot alone.
    """

    config: TrunkConfig

    def __init__(self, config: TrunkConfig, options: TrunkOptions, output_norm: torch.Tensor,
                 output: Linear, norm_eps: float, logit_softcap: float | None = None) -> None:
        self.config, self.options = config, options
        self._output_norm, self._output, self._norm_eps = output_norm, output, norm_eps
        self._logit_softcap = logit_softcap
        self._positions = [0] * options.slots

    # --- the contract, per slot ---------------------------------------------

    @property
    def position(self) -> int:
        return self._positions[0]

    def position_of(self, slot: int) -> int:
        return self._positions[slot]

    def sequence(self, slot: int) -> TrunkSequence:
        """Slot `slot` as a one-sequence `Trunk`."""
        if not 0 <= slot < self.options.slots:
            raise ValueError(f"slot {slot} is outside the trunk's {self.options.slots} slots")
        return TrunkSequence(self, slot)

    def forward(self, tokens: Sequence[int], taps: Sequence[int] = (), slot: int = 0) -> ForwardOut:
        return self.forward_parts([Part(slot, tokens)], taps)[0]

    def prefill(self, tokens: Sequence[int], taps: Sequence[int] = (), all_logits: bool = False,
                slot: int = 0) -> ForwardOut:
        """Append a prompt in fixed `prefill_chunk` chunks; logits of the last row, or of every row with `all_logits`."""
        if not tokens:
            raise ValueError("prefill needs at least one token")
        self._check_room(slot, len(tokens))
        outs, begin = [], 0
        while begin < len(tokens):
            piece = tokens[begin:begin + self.chunk_room(slot)]
            begin += len(piece)
            last = begin == len(tokens)
            outs.append(self.prefill_parts([Part(slot, piece, None if all_logits else int(last))], taps)[0])
        return ForwardOut(logits=torch.cat([o.logits for o in outs]),
                          hidden={layer: torch.cat([o.hidden[layer] for o in outs]) for layer in taps})

    def chunk_room(self, slot: int = 0) -> int:
        """Rows left in the slot's current prefill chunk: prefill chunks cover positions [j * chunk, (j + 1) * chunk),
        wherever a prefill starts, so a prompt's rows are computed the same way however it is split."""
        chunk = self.options.prefill_chunk
        return chunk - self._positions[slot] % chunk

    def rewind(self, length: int, slot: int = 0) -> None:
        if not 0 <= length <= self._positions[slot]:
            raise ValueError(f"rewind to {length} is outside the committed range [0, {self._positions[slot]}]")
        self._rewind_state(slot, length)
        self._positions[slot] = length

    def checkpoint(self, slot: int = 0) -> Any:
        return (self._positions[slot], self._state_checkpoint(slot))

    def restore(self, checkpoint: Any, slot: int = 0) -> None:
        position, state = checkpoint
        self._restore_state(slot, state)
        self._positions[slot] = position

    def reset(self, slot: int = 0) -> None:
        self._reset_state(slot)
        self._positions[slot] = 0

    def reusable_prefix(self, length: int, slot: int = 0) -> int:
        """The longest prefix, at most `length` positions, from which this slot can go on exactly as if its prompt
        had been prefilled from the start: whole prefill chunks (positions computed by the same chunk forwards)."""
        chunk = self.options.prefill_chunk
        return min(length, self._positions[slot]) // chunk * chunk

    def resume(self, length: int, slot: int = 0) -> None:
        """Keep the first `length` positions (a `reusable_prefix`) for a new request that shares them."""
        self.rewind(length, slot)

    # --- shared forwards ------------------------------------------------------

    def forward_parts(self, parts: Sequence[Part], taps: Sequence[int] = ()) -> list[ForwardOut]:
        """Append each part's tokens to its slot, all in one forward of exactly `verify_capacity` rows."""
        capacity = self.config.verify_capacity
        rows = sum(len(part.tokens) for part in parts)
        if not parts or not 1 <= rows <= capacity or any(not part.tokens for part in parts):
            raise ValueError(f"a forward takes 1..{capacity} rows (the verification capacity), got {rows}")
        return self._forward(parts, capacity, taps, prefill=False)

    def prefill_parts(self, parts: Sequence[Part], taps: Sequence[int] = ()) -> list[ForwardOut]:
        """One prefill chunk forward of exactly `prefill_chunk` rows: each part stays inside its slot's current
        chunk (`chunk_room`); the logits of each part's last `logit_rows` rows."""
        chunk = self.options.prefill_chunk
        for part in parts:
            if not 1 <= len(part.tokens) <= self.chunk_room(part.slot):
                raise ValueError(f"a prefill part of {len(part.tokens)} rows does not fit the "
                                 f"{self.chunk_room(part.slot)} rows left in slot {part.slot}'s chunk")
        if sum(len(part.tokens) for part in parts) > chunk:
            raise ValueError(f"prefill parts of {sum(len(p.tokens) for p in parts)} rows exceed the chunk of {chunk}")
        return self._forward(parts, chunk, taps, prefill=True)

    def _forward(self, parts: Sequence[Part], rows: int, taps: Sequence[int], prefill: bool) -> list[ForwardOut]:
        if len({part.slot for part in parts}) != len(parts):
            raise ValueError("a forward holds at most one part per slot")
        segments, row = [], 0
        for part in parts:
            self._check_room(part.slot, len(part.tokens))
            segments.append(Segment(part.slot, row, len(part.tokens), self._positions[part.slot]))
            row += len(part.tokens)
        tokens = self._padded([token for part in parts for token in part.tokens], rows)
        final, tapped = self._run(tokens, RowBatch(rows, segments, self.options.device, prefill), taps)
        for segment in segments:
            self._positions[segment.slot] += segment.n
        wanted = torch.cat([final[s.row + s.n - part.wanted:s.row + s.n] for s, part in zip(segments, parts, strict=True)])
        logits = self.logits(wanted) if wanted.shape[0] else final.new_zeros(0, self.config.vocab_size)
        logits = logits.split([part.wanted for part in parts])
        return [ForwardOut(logits=rows_logits, hidden={layer: h[s.rows] for layer, h in tapped.items()})
                for s, rows_logits in zip(segments, logits, strict=True)]

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

    def _run(self, tokens: torch.Tensor, batch: RowBatch,
             taps: Sequence[int]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """tokens [m] (padded), the batch's segments -> final residual [m, d], taps {layer: [m, d]}; writes each
        segment's cache rows (and recurrent state) in its own slot."""
        raise NotImplementedError

    def _rewind_state(self, slot: int, length: int) -> None:
        """Attention-only trunks have nothing to do: slots past `length` are masked."""

    def _state_checkpoint(self, slot: int) -> Any:
        """Attention-only trunks keep no state beyond the position: nothing to save."""

    def _restore_state(self, slot: int, state: Any) -> None:
        """Attention-only trunks keep no state beyond the position."""

    def _reset_state(self, slot: int) -> None:
        """Attention-only trunks keep no state beyond the position."""

    # --- helpers -------------------------------------------------------------

    def _check_room(self, slot: int, n: int) -> None:
        position = self._positions[slot]
        if position + n > self.config.n_ctx:
            raise ContextOverflow(f"{position + n} positions do not fit the context of {self.config.n_ctx} "
                                  f"({position} in the cache + {n} new); raise the plan's ctx or shorten the prompt")

    def _padded(self, tokens: Sequence[int], rows: int) -> torch.Tensor:
        return torch.tensor(list(tokens) + [PAD_TOKEN] * (rows - len(tokens)), dtype=torch.long,
                            device=self.options.device)



class TrunkSequence:
    """One slot of a trunk as a one-sequence `Trunk` (what a request's transaction drives)."""

    def __init__(self, trunk: FixedShapeTrunk, slot: int) -> None:
        self.trunk, self.slot = trunk, slot

    @property
    def config(self) -> TrunkConfig:
        return self.trunk.config

    @property
    def position(self) -> int:
        return self.trunk.position_of(self.slot)

    def forward(self, tokens: Sequence[int], taps: Sequence[int] = ()) -> ForwardOut:
        return self.trunk.forward(tokens, taps, slot=self.slot)

    def prefill(self, tokens: Sequence[int], taps: Sequence[int] = (), all_logits: bool = False) -> ForwardOut:
        return self.trunk.prefill(tokens, taps, all_logits, slot=self.slot)

    def chunk_room(self) -> int:
        return self.trunk.chunk_room(self.slot)

    def rewind(self, length: int) -> None:
        self.trunk.rewind(length, self.slot)

    def checkpoint(self) -> Any:
        return self.trunk.checkpoint(self.slot)

    def restore(self, checkpoint: Any) -> None:
        self.trunk.restore(checkpoint, self.slot)

    def reset(self) -> None:
        self.trunk.reset(self.slot)

    def reusable_prefix(self, length: int) -> int:
        return self.trunk.reusable_prefix(length, self.slot)

    def resume(self, length: int) -> None:
        self.trunk.resume(length, self.slot)
