"""How Power's runtime lays a plan's context out: slots, positions a slot, cache capacity. Torch-free.

The one rule both halves read: the runtime's `Engine` builds its trunk from it,
and the orchestrator's sizing charges what it allocates
(`power.orchestrator.engines.power.sizing`), so a plan's KV figure is what the
runtime holds (docs/sizing.md, "Power's runtime").

Each slot gets its own region of ctx / slots positions (llama-server's split
without a unified KV cache); every attention layer, sliding or global, keeps
that region plus room for the padding rows of the largest forward shape (the
verification capacity, or a prefill chunk), rounded up to whole cache blocks.
A unified cache (one region shared by every slot) is not how the runtime
allocates: `Engine` refuses such a plan, and so does the compiler.
"""

from __future__ import annotations

from dataclasses import dataclass

# The runtime's cache block (its caches hold whole blocks: runtime/kv_cache.py) and its prefill chunk (the rows one
# prefill forward takes: runtime/trunks/base.py). Defined here, read there.
ATTENTION_BLOCK = 256
PREFILL_CHUNK = 32


@dataclass(frozen=True)
class Geometry:
    slots: int
    positions_per_slot: int  # the context one request may use: ctx / slots
    cache_capacity: int  # one slot's positions plus the largest forward's padding rows
    allocated_positions: int  # the capacity rounded up to whole cache blocks: what each layer holds per slot


def runtime_geometry(ctx: int, slots: int, verify_capacity: int, prefill_chunk: int = PREFILL_CHUNK) -> Geometry:
    """The runtime's layout of `ctx` positions over `slots` slots, each its own region."""
    positions = ctx // slots
    capacity = positions + max(verify_capacity, prefill_chunk)
    return Geometry(slots, positions, capacity, padded_capacity(capacity))


def padded_capacity(capacity: int) -> int:
    """Cache positions for `capacity` positions: a whole number of ATTENTION_BLOCK blocks."""
    return -(-capacity // ATTENTION_BLOCK) * ATTENTION_BLOCK
