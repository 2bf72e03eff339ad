"""The trunk contract: what the speculative loop needs from a target model, and nothing about drafting.

A row's arithmetic never depends on how many rows ran beside it: in the quantised
arithmetic every op is row-count invariant and a forward runs on its real rows; in
the float32 reference every forward is padded to `verify_capacity` rows. Either
way plain decode (one row) and a verify (K+1 rows) compute a row alike, into a
fixed-capacity cache read under a mask; this is what makes greedy speculative
output bit-identical to autoregressive output.

Rollback: attention layers rewind by length (rows past it are masked and later
overwritten). Recurrent layers keep per-row state snapshots for the *last*
`snapshot_rows` (S) rows of the most recent forward, so after a forward of n rows
from position p the trunk can rewind to any length in [p + n - S, p + n]; a
shorter length is outside the resident window and `rewind` raises
`OutsideResidentWindow` - the caller then restores its checkpoint and replays.

Prefill returns the last prompt row's logits by default (`all_logits=True` for
every row); its hidden taps always cover every prompt row. A prompt's rows are
computed in chunks aligned to positions [j * chunk, (j + 1) * chunk), so its
first j * chunk positions hold the same bits whichever request computed them: a
new request that shares them resumes there (`reusable_prefix`, `resume`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import torch

from power.runtime.embedding import TokenEmbedding
from power.runtime.linear import Linear


class OutsideResidentWindow(RuntimeError):
    """A rewind target whose recurrent state is no longer resident (rejected suffix longer than S)."""


@dataclass(frozen=True)
class TrunkConfig:
    architecture: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_ctx: int  # one sequence's context in positions
    verify_capacity: int  # fixed number of rows every forward runs at
    snapshot_rows: int  # S: resident per-row recurrent snapshots (0 for attention-only trunks)
    recurrent: bool
    slots: int = 1  # sequences the trunk holds side by side, each with its own cache region and state
    device: str = "cpu"  # where its weights, caches and activations live


@dataclass
class ForwardOut:
    logits: torch.Tensor  # [n, vocab] float32, one row per real input token
    # layer index L -> [n, d_model] residual entering layer L; L == n_layers -> final residual before the output norm
    hidden: dict[int, torch.Tensor]
    # [n] int64: each row's argmax (lowest token ID on ties), when the forward was asked for that only and chose it by
    # the exact greedy head; `logits` then has no rows
    argmax: torch.Tensor | None = None


class Trunk(Protocol):
    @property
    def config(self) -> TrunkConfig:
        """The shape the trunk was built with."""

    @property
    def position(self) -> int:
        """Number of positions committed in the cache (the next token's position)."""

    def forward(self, tokens: Sequence[int], taps: Sequence[int] = ()) -> ForwardOut:
        """Append `tokens` (1..verify_capacity of them) at [position, position + n)."""

    def prefill(self, tokens: Sequence[int], taps: Sequence[int] = (), all_logits: bool = False) -> ForwardOut:
        """Append a prompt of any length (in position-aligned chunks); taps for every prompt row, logits for the
        last row only unless `all_logits` (the LM head is the dearest part of a row; values are the same)."""

    def chunk_room(self) -> int:
        """Rows left in the current prefill chunk (chunks cover positions [j * chunk, (j + 1) * chunk))."""

    def reusable_prefix(self, length: int) -> int:
        """The longest prefix, at most `length` positions, a new request sharing it can `resume` from exactly."""

    def resume(self, length: int) -> None:
        """Keep the first `length` positions (a `reusable_prefix`) for a new request; forget the rest."""

    def rewind(self, length: int) -> None:
        """Keep the first `length` positions; restore recurrent state from the per-row snapshot for that length."""

    def checkpoint(self) -> Any:
        """An opaque, restorable copy of the committed state (position + recurrent state)."""

    def restore(self, checkpoint: Any) -> None:
        """Return to a checkpoint taken earlier in this request (attention rows past it are masked)."""

    def reset(self) -> None:
        """Empty the cache and recurrent state for a new request."""

    @property
    def embedding(self) -> TokenEmbedding:
        """The token embedding, as the trunk holds it (a drafter borrows it: one copy)."""

    @property
    def lm_head(self) -> Linear:
        """The output projection [vocab, d], as the trunk holds it (a drafter's head borrows it: one copy)."""
