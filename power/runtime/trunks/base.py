"""What every trunk shares: the forward, chunked prefill, the LM head, rewind and checkpoints.

A trunk holds `slots` sequences side by side. A concrete trunk implements
`_run(tokens, batch, taps)`: push a block of rows through its layers, writing
each segment's cache rows (and recurrent state) in its own slot
(`power.runtime.trunks.batch`), and return the final residual (before the
output norm) plus the requested taps. This class owns the shapes.

A trunk runs one of two paths (`TrunkOptions.path`): the CPU path (the CPU's
quantised products, `power.kernels.cpu`; torch norms; attention per row,
`power.runtime.kv_cache`) or the GPU path (the Triton product on the file's
rows, the Triton norms and attention through `power.kernels.dispatch`; on a CUDA
device, or forced on the CPU for tests under Triton's interpreter). On both,
norms, rope, the elementwise ops and attention compute a row the same way at any
row count, so whether a forward may run on its real rows only (`real_rows`) is
decided by the products: in the quantised arithmetic every product is row-count
invariant, and a forward runs on its real rows only: a plain round is one row, a
speculative round K+1, a batch the sum of its requests' rows, a prefill chunk
its prompt rows.

Otherwise (the float32 reference arithmetic, or a matrix whose type the GPU
product does not read) the shapes are fixed:

- `forward` / `forward_parts` pad their 1..verify_capacity rows (of one or
  several sequences) to exactly `verify_capacity`;
- `prefill` / `prefill_parts` pad each chunk to exactly `prefill_chunk` rows;
- the LM head runs on blocks of exactly `verify_capacity` rows.

Either way prefill chunks cover positions [j * chunk, (j + 1) * chunk) of their
sequence, so a row's logits never depend on how many real rows ran beside it or
whose they were, and a prompt's logits are the same whoever prefills it, in one
go or piece by piece, alone or beside other sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from power.artifacts.gguf_reader import ArtifactError
from power.documents.arithmetic import ARITHMETICS, QUANTISED
from power.documents.geometry import PREFILL_CHUNK
from power.documents.greedy_head import BLOCK as GREEDY_BLOCK
from power.documents.greedy_head import ROWS as GREEDY_ROWS
from power.documents.kv_types import F32
from power.kernels.cpu.layout import TILE
from power.runtime.cuda_graphs import GRAPHS_OFF, CudaGraphError, CudaRecorder, ForwardGraphs, Recorder
from power.runtime.embedding import TokenEmbedding
from power.runtime.errors import ContextOverflow, RuntimeInputError
from power.runtime.gguf_weights import GGUFFile
from power.runtime.greedy_head import GreedyHead, head_refusal
from power.runtime.kv_cache import SlotCaches, check_device_kv_type
from power.runtime.layers import Norm, softcap
from power.runtime.linear import Float32Linear, Linear, Stacked, quantised
from power.runtime.trunks.batch import DeviceRows, RowBatch, Segment
from power.runtime.trunks.protocol import ForwardOut, TrunkConfig

PAD_TOKEN = 0
EMBEDDING, OUTPUT = "token_embd.weight", "output.weight"
GREEDY_HEAD = "greedy LM head (the head held once as its pass's stream: its norm bytes)"
PATHS = ("auto", "cpu", "gpu")


@dataclass(frozen=True)
class TrunkOptions:
    """How to instantiate a trunk: capacity, shapes and arithmetic (the plan decides these).

    `n_ctx` is one sequence's context; the trunk holds `slots` sequences, each with a cache region of its own.
    """

    n_ctx: int
    verify_capacity: int
    snapshot_rows: int = 0
    arithmetic: str = QUANTISED  # `power.documents.arithmetic`
    prefill_chunk: int = PREFILL_CHUNK
    device: str = "cpu"  # where weights, caches and activations live ("cpu", "cuda", "cuda:1", ...)
    slots: int = 1  # sequences decoded side by side
    # "auto": the GPU path off the CPU, the CPU path on it; "gpu" on the CPU runs the GPU path's kernels there (Triton's
    # interpreter with POWER_KERNELS=triton, else their torch references): for tests and `gpu-check --interpret`.
    path: str = "auto"
    kv_type: str = F32  # the element type the attention caches hold their rows in (`power.documents.kv_types`)
    # greedy rows' tokens from the exact greedy LM head where `power.documents.greedy_head` allows; off: the full head
    greedy_head: bool = True
    # each layer as one CPU kernel call where the trunk has one (Gemma 3 on the CPU kernels: the same bits); off: op
    # by op, as the tests compare them
    layer_kernels: bool = True

    def __post_init__(self) -> None:
        if self.path not in PATHS or (self.path == "cpu" and torch.device(self.device).type != "cpu"):
            raise RuntimeInputError(f"path {self.path!r} on device {self.device!r} is not supported (choose "
                                    f"{', '.join(PATHS)}; the CPU path runs on the CPU only)")
        if self.arithmetic not in ARITHMETICS:
            raise RuntimeInputError(f"arithmetic {self.arithmetic!r} is not supported (choose "
                                    f"{', '.join(ARITHMETICS)})")
        if self.verify_capacity < 1 or self.n_ctx < 1 or self.prefill_chunk < 1 or self.slots < 1:
            raise RuntimeInputError(f"n_ctx ({self.n_ctx}), verify_capacity ({self.verify_capacity}), "
                                    f"prefill_chunk ({self.prefill_chunk}) and slots ({self.slots}) must be positive")
        check_device_kv_type(self.kv_type, self.kernels)

    @property
    def cache_capacity(self) -> int:
        """One slot's context plus room for the padding rows of the largest forward shape."""
        return self.n_ctx + max(self.verify_capacity, self.prefill_chunk)

    @property
    def kernels(self) -> bool:
        """The GPU path: products, norms and attention through `power.kernels.dispatch`."""
        return self.path == "gpu" or (self.path == "auto" and torch.device(self.device).type != "cpu")


def slot_caches(options: TrunkOptions, n_kv_heads: int, head_dim_k: int, head_dim_v: int) -> SlotCaches:
    """One attention layer's caches: a region of `cache_capacity` positions for each slot."""
    return SlotCaches(options.slots, n_kv_heads, options.cache_capacity, head_dim_k, head_dim_v, options.device,
                      options.kv_type)


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
        """`{arch}.vocab_size`, else the token embedding's rows (an MTP-only file may carry no embedding)."""
        declared = self.get("vocab_size")
        return int(declared) if declared else self.gguf.info(EMBEDDING).shape[0]

    def require(self, name: str) -> Any:
        return self.gguf.require(f"{self.arch}.{name}")

    def get(self, name: str, default: Any = None) -> Any:
        return self.gguf.get(f"{self.arch}.{name}", default)


class Weights:
    """Reads a trunk's tensors from its GGUF: matrices in the trunk's arithmetic (`power.runtime.linear`), the token
    embedding as its GGUF rows or, tied, as the LM head's (`power.runtime.embedding`), vectors in float32.

    `rows` is the forward shape float32 matrices are laid out for (the verification capacity). `held` records what
    each tensor costs in memory once loaded (`nbytes`: the sizing of Power's runtime counts the same).
    """

    def __init__(self, gguf: GGUFFile, options: TrunkOptions) -> None:
        self.gguf, self.arithmetic, self.device = gguf, options.arithmetic, options.device
        self.kernels = options.kernels
        self.rows = options.verify_capacity
        self.held: dict[str, int] = {}
        self.linears: list[Linear] = []
        self._head: Linear | None = None

    def matrix(self, name: str, shape: Sequence[int]) -> Linear:
        return self.fused((name, shape))

    def fused(self, *matrices: tuple[str, Sequence[int]]) -> Linear:
        """One callable for several matrices that read the same input: their outputs side by side, in order (one
        float32 product; quantised, one product per run of neighbours in the same GGUF type, their blocks stacked
        into one matrix: each output row is computed alone, so stacking changes no bit and saves a call each)."""
        if self.arithmetic == QUANTISED:
            parts = [self._quantised(run) for run in self._same_type_runs(matrices)]
            return parts[0] if len(parts) == 1 else Stacked(parts)
        weight = torch.cat([self.gguf.tensor(name, shape, self.device) for name, shape in matrices])
        return self._holding(" + ".join(name for name, _ in matrices), Float32Linear(weight, self.rows))

    def _same_type_runs(self, matrices: Sequence[tuple[str, Sequence[int]]]) -> list[list[tuple[str, Sequence[int]]]]:
        """`matrices` cut into runs of neighbours that share a GGUF type, in order. A run goes on past a matrix only
        when its rows fill whole tiles of the CPU kernels, so the stack holds the bytes the matrices would hold alone
        (what sizing charges)."""
        runs: list[list[tuple[str, Sequence[int]]]] = []
        previous: tuple[str, int] | None = None
        for name, shape in matrices:
            qtype = self.gguf.expect(name, shape).qtype
            if previous is not None and previous[0] == qtype and previous[1] % TILE == 0:
                runs[-1].append((name, shape))
            else:
                runs.append([(name, shape)])
            previous = (qtype, int(shape[0]))
        return runs

    def lm_head(self, shape: Sequence[int]) -> Linear:
        """`output.weight` [vocab, d], or the token embedding when the output is tied to it (built once)."""
        if self._head is None:
            name = OUTPUT if self.gguf.has(OUTPUT) else EMBEDDING
            if self.arithmetic == QUANTISED:
                self._head = self._quantised([(name, shape)], f"{name} (LM head)")
            else:
                self._head = self._holding(f"{name} (LM head)",
                                           Float32Linear(self.gguf.tensor(name, shape, self.device), self.rows))
        return self._head

    def embedding(self, shape: Sequence[int]) -> TokenEmbedding:
        """`token_embd.weight` [vocab, d]: its own GGUF rows, or, tied to the LM head, the head's rows (held once)."""
        if not self.gguf.has(OUTPUT):
            return TokenEmbedding.tied(self.lm_head(shape))
        embedding = TokenEmbedding.of_gguf(self.gguf, EMBEDDING, shape, self.device)
        self.held[EMBEDDING] = embedding.nbytes
        return embedding

    def tensor(self, name: str, shape: Sequence[int]) -> torch.Tensor:
        """A float32 tensor on the trunk's device (norm weights, biases, per-head constants)."""
        tensor = self.gguf.tensor(name, shape, self.device)
        self.held[name] = tensor.numel() * tensor.element_size()
        return tensor

    def optional_tensor(self, name: str, shape: Sequence[int]) -> torch.Tensor | None:
        return self.tensor(name, shape) if self.gguf.has(name) else None

    def norm(self, name: str, shape: Sequence[int], eps: float) -> Norm:
        """An RMS norm with this weight, on the trunk's path."""
        return Norm(self.tensor(name, shape), eps, self.kernels)

    def optional_norm(self, name: str, shape: Sequence[int], eps: float) -> Norm | None:
        return self.norm(name, shape, eps) if self.gguf.has(name) else None

    @property
    def row_count_invariant(self) -> bool:
        """Every product computes a row the same way at any row count."""
        return all(linear.row_count_invariant for linear in self.linears)

    @property
    def paths(self) -> str:
        """The instruction paths the products take, in order of first use."""
        return "+".join(dict.fromkeys(linear.path for linear in self.linears))

    def _quantised(self, matrices: Sequence[tuple[str, Sequence[int]]], label: str | None = None) -> Linear:
        """Matrices of one GGUF type and width kept in their blocks, stacked (a row-major matrix's bytes are its rows
        in order). On the GPU path, a type the Triton product does not read is dequantised to float32 (exact; such a
        trunk pads its forwards); on the CPU path every type the runtime reads has a kernel."""
        qtype = self.gguf.expect(*matrices[0]).qtype
        out_features, in_features = sum(int(shape[0]) for _, shape in matrices), int(matrices[0][1][1])
        raw = _stacked([self.gguf.raw(name) for name, _ in matrices])
        linear = quantised(raw, qtype, (out_features, in_features), self.device, self.kernels)
        if linear is None:
            linear = Float32Linear(_stacked([self.gguf.tensor(name, shape, self.device) for name, shape in matrices]),
                                   self.rows)
        return self._holding(label or " + ".join(name for name, _ in matrices), linear)

    def _holding(self, name: str, linear: Linear) -> Linear:
        self.held[name] = linear.nbytes
        self.linears.append(linear)
        return linear


def _stacked(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The tensors one after the other along the first dimension (a lone one as it is: no copy of an LM head)."""
    return tensors[0] if len(tensors) == 1 else torch.cat(list(tensors))


@dataclass(frozen=True)
class Part:
    """One sequence's rows in a shared forward: its slot, its tokens, how many of its last rows need logits (None:
    every row; the LM head is the dearest part of a row, so a prefill chunk asks for its last row at most), and whether
    those rows need only their argmax (greedy sampling: the trunk may choose it by the exact greedy head)."""

    slot: int
    tokens: Sequence[int]
    logit_rows: int | None = None
    argmax_only: bool = False

    @property
    def wanted(self) -> int:
        return len(self.tokens) if self.logit_rows is None else self.logit_rows


class FixedShapeTrunk:
    """The trunk contract (`power.runtime.trunks.protocol.Trunk`) over a concrete `_run`, for `options.slots`
    sequences at once.

    Each slot is one sequence with its own cache region, position and (for a recurrent trunk) state. The
    contract's methods act on one slot (`slot=0` unless given); `sequence(slot)` is that slot as a `Trunk`.
    `forward_parts` and `prefill_parts` run several slots' rows in one forward (`power.runtime.trunks.batch`),
    each row computed exactly as in a forward of its slot alone.
    """

    config: TrunkConfig
    embedding: TokenEmbedding  # set by each concrete trunk

    def __init__(self, config: TrunkConfig, options: TrunkOptions, weights: Weights, output_norm: Norm,
                 output: Linear, logit_softcap: float | None = None) -> None:
        self.config, self.options = config, options
        self._output_norm, self._output = output_norm, output
        self._logit_softcap = logit_softcap
        self._greedy: GreedyHead | None = None  # built by `take_greedy_head`
        self.head_refusal = head_refusal(output, logit_softcap, options.greedy_head)
        self.greedy_rows = 0  # rows whose token the greedy head chose
        self._positions = [0] * options.slots
        self.held = dict(weights.held)  # tensor -> bytes held in memory (what sizing counts)
        self.instruction_path = weights.paths
        # Norms, rope, the elementwise ops and attention give a row the same bits at any row count on both paths (the
        # CPU's per-row products, tests/test_trunks.py; the GPU path's one program per row, docs/kernels.md), so the
        # products decide: real rows when every one of them is row-count invariant, the fixed shapes otherwise.
        self.real_rows = weights.row_count_invariant
        self.graphs: ForwardGraphs | None = None  # the decode forwards' CUDA graphs, once `capture_graphs` is called

    @property
    def weight_bytes(self) -> int:
        """What the trunk's weights hold in memory, every matrix, vector and the embedding."""
        return sum(self.held.values())

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

    def forward(self, tokens: Sequence[int], taps: Sequence[int] = (), slot: int = 0,
                argmax_only: bool = False) -> ForwardOut:
        return self.forward_parts([Part(slot, tokens, argmax_only=argmax_only)], taps)[0]

    def prefill(self, tokens: Sequence[int], taps: Sequence[int] = (), all_logits: bool = False,
                slot: int = 0, argmax_only: bool = False) -> ForwardOut:
        """Append a prompt in fixed `prefill_chunk` chunks; logits of the last row, or of every
        row with `all_logits` (`argmax_only`: the last row's argmax, `ForwardOut.argmax`, where the trunk takes the
        greedy head)."""
        if not tokens:
            raise ValueError("prefill needs at least one token")
        self._check_room(slot, len(tokens))
        outs, begin = [], 0
        while begin < len(tokens):
            piece = tokens[begin:begin + self.chunk_room(slot)]
            begin += len(piece)
            last = begin == len(tokens)
            outs.append(self.prefill_parts([Part(slot, piece, None if all_logits else int(last),
                                                 argmax_only and not all_logits)], taps)[0])
        return ForwardOut(logits=torch.cat([o.logits for o in outs]),
                          hidden={layer: torch.cat([o.hidden[layer] for o in outs]) for layer in taps},
                          argmax=outs[-1].argmax)

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
        """Append each part's tokens to its slot, all in one forward of 1..`verify_capacity` rows (padded to it when
        the trunk does not run real rows)."""
        capacity = self.config.verify_capacity
        rows = sum(len(part.tokens) for part in parts)
        if not parts or not 1 <= rows <= capacity or any(not part.tokens for part in parts):
            raise ValueError(f"a forward takes 1..{capacity} rows (the verification capacity), got {rows}")
        return self._forward(parts, capacity, taps, prefill=False)

    def prefill_parts(self, parts: Sequence[Part], taps: Sequence[int] = ()) -> list[ForwardOut]:
        """One prefill chunk forward of at most `prefill_chunk` rows (padded to it when the trunk does not run real
        rows): each part stays inside its slot's current chunk (`chunk_room`); the logits of each part's last
        `logit_rows` rows."""
        chunk = self.options.prefill_chunk
        for part in parts:
            if not 1 <= len(part.tokens) <= self.chunk_room(part.slot):
                raise ValueError(f"a prefill part of {len(part.tokens)} rows does not fit the "
                                 f"{self.chunk_room(part.slot)} rows left in slot {part.slot}'s chunk")
        if sum(len(part.tokens) for part in parts) > chunk:
            raise ValueError(f"prefill parts of {sum(len(p.tokens) for p in parts)} rows exceed the chunk of {chunk}")
        return self._forward(parts, chunk, taps, prefill=True)

    def _forward(self, parts: Sequence[Part], shape: int, taps: Sequence[int], prefill: bool) -> list[ForwardOut]:
        if len({part.slot for part in parts}) != len(parts):
            raise ValueError("a forward holds at most one part per slot")
        segments, row = [], 0
        for part in parts:
            self._check_room(part.slot, len(part.tokens))
            segments.append(Segment(part.slot, row, len(part.tokens), self._positions[part.slot]))
            row += len(part.tokens)
        rows = row if self.real_rows else shape
        tokens = self._padded([token for part in parts for token in part.tokens], rows)
        batch = RowBatch(rows, segments, self.options.device, prefill, kernels=self.options.kernels)
        if self.graphs is not None and not prefill:
            final, tapped = self.graphs.run(tokens, batch.positions, batch.slots, taps)
        else:
            final, tapped = self._run(tokens, batch, taps)
        for segment in segments:
            self._positions[segment.slot] += segment.n
        wanted = torch.cat([final[s.row + s.n - part.wanted:s.row + s.n] for s,
                            part in zip(segments, parts, strict=True)])
        hidden = [{layer: h[s.rows] for layer, h in tapped.items()} for s in segments]
        no_logits = final.new_zeros(0, self.config.vocab_size)
        sizes = [part.wanted for part in parts]
        if self._greedy_takes(parts):
            argmax = self.greedy_argmax(wanted).split(sizes)
            return [ForwardOut(no_logits, rows, chosen) for rows, chosen in zip(hidden, argmax, strict=True)]
        logits = self.logits(wanted) if wanted.shape[0] else no_logits
        return [ForwardOut(rows_logits, rows) for rows, rows_logits in zip(hidden, logits.split(sizes), strict=True)]

    def _greedy_takes(self, parts: Sequence[Part]) -> bool:
        """Whether the greedy head chooses this forward's tokens: every row wants only its argmax
        (`power.documents.greedy_head`)."""
        return (self._greedy is not None and sum(part.wanted for part in parts) > 0
                and all(part.argmax_only for part in parts if part.wanted))

    # --- CUDA graphs -------------------------------------------------------------

    def capture_graphs(self, recorder: Recorder | None = None) -> None:
        """Run every decode forward from now on through a CUDA graph of its shape, captured on its first use
        (`power.runtime.cuda_graphs`; prefill chunks stay eager). `recorder` replaces the CUDA capture (tests: `Rerun`
        off a GPU). Refused (CudaGraphError) where the forward reads more than its device buffers."""
        refusal = self._graph_refusal(recorder)
        if refusal:
            raise CudaGraphError(f"the {self.config.architecture} trunk cannot run in CUDA graphs: {refusal}",
                                 hint=GRAPHS_OFF)
        self.graphs = ForwardGraphs(self._graph_forward, recorder or CudaRecorder(self.options.device))

    def _graph_refusal(self, recorder: Recorder | None) -> str | None:
        if not self.options.kernels:
            return "the CPU path's attention reads each sequence's rows in Python (graphs need the GPU path)"
        if self.config.recurrent:
            return "its recurrent layers run each sequence's rows through their state in Python"
        if recorder is None and torch.device(self.options.device).type != "cuda":
            return f"the device {self.options.device!r} is not a CUDA device"
        return None

    def _graph_forward(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                       taps: Sequence[int]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        return self._run(tokens, DeviceRows(tokens.numel(), positions, slots), taps)

    # --- the LM head ----------------------------------------------------------

    def take_greedy_head(self, calibration: Sequence[int]) -> None:
        """Build the exact greedy head (where `head_refusal` is None), its exact blocks calibrated on the normed final
        rows of the tokens `calibration` (at most a slot's context of them, prefilled in slot 0, which is emptied
        again); what it holds is in `held`."""
        if self.head_refusal is not None:
            raise RuntimeInputError(f"this trunk keeps the full LM head: {self.head_refusal}")
        layers = self.config.n_layers
        self.reset(0)
        final = self.prefill(calibration[:self.config.n_ctx], taps=[layers]).hidden[layers]
        self.reset(0)
        self._greedy = GreedyHead.calibrated(self._output, self._output_norm(final))
        if self.embedding.tied_to(self._output):
            self.embedding = TokenEmbedding.tied(self._greedy.head)
        self._output = self._greedy.head  # the head held once: its Q8_0 tiles go
        self.held[GREEDY_HEAD] = self._greedy.nbytes

    @property
    def head_path(self) -> str:
        """Which LM head chooses a greedy row's token, for the receipt."""
        if self._greedy is not None:
            return (f"greedy (exact bound and refine, blocks {self._greedy.exact_blocks} of "
                    f"{self._output.shape[1] // GREEDY_BLOCK} exact) for {GREEDY_ROWS}-row greedy forwards, "
                    "the full product's argmax in the kernel for more, full logits otherwise")
        return f"full ({self.head_refusal or 'the greedy head was not built'})"

    def greedy_argmax(self, final: torch.Tensor) -> torch.Tensor:
        """final residual rows [m, d] -> [m] int64, each row's argmax of `logits`, by the greedy head."""
        assert self._greedy is not None, "take_greedy_head builds it"
        tokens = self._greedy.argmax(self._output_norm(final))
        self.greedy_rows += tokens.numel()
        return tokens

    @property
    def lm_head(self) -> Linear:
        """The output projection [vocab, d], packed in the trunk's arithmetic."""
        return self._output

    def logits(self, final: torch.Tensor) -> torch.Tensor:
        """final residual rows [m, d] -> logits [m, vocab], the head run on the m rows alone when its rows are the
        same at any row count (the quantised head's are), else on blocks of exactly verify_capacity rows."""
        capacity = self.config.verify_capacity
        normed = self._output_norm(final)
        if self._output.row_count_invariant:
            return softcap(self._output(normed), self._logit_softcap)
        blocks = []
        for begin in range(0, normed.shape[0], capacity):
            rows = normed[begin:begin + capacity]
            padded = torch.cat((rows, rows.new_zeros(capacity - rows.shape[0], rows.shape[1])))
            blocks.append(self._output(padded)[:rows.shape[0]])
        return softcap(torch.cat(blocks), self._logit_softcap)

    # --- for concrete trunks ------------------------------------------------

    def _run(self, tokens: torch.Tensor, batch: DeviceRows,
             taps: Sequence[int]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """tokens [m] (padded), the forward's rows -> final residual [m, d], taps {layer: [m, d]}; writes each
        sequence's cache rows (and recurrent state) in its own slot. `batch` is a `RowBatch`, or, in a CUDA graph, the
        bare `DeviceRows` (a trunk whose layers need the segments refuses graphs: `capture_graphs`)."""
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

    @property
    def embedding(self) -> TokenEmbedding:
        return self.trunk.embedding

    @property
    def lm_head(self) -> Linear:
        return self.trunk.lm_head

    def reusable_prefix(self, length: int) -> int:
        return self.trunk.reusable_prefix(length, self.slot)

    def resume(self, length: int) -> None:
        self.trunk.resume(length, self.slot)
