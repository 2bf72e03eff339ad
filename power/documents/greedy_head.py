"""When Power's runtime picks a greedy row's token with the exact greedy LM head, and what that head holds. Torch-free.

The exact greedy head (`power.runtime.greedy_head`, docs/runtime.md "The exact greedy LM head") returns the full
head's argmax bit for bit from a cheap pass over a compact copy of the head and the exact scores of a few tokens. A
trunk takes it at load (`refusal` is None) when all of these hold, and the full head otherwise:

- the products are the CPU kernels' quantised ones (the pass is a CPU kernel beside them);
- the LM head is Q8_0 (the pass splits Q8_0 weights into nibbles);
- the model has no final logit softcap: argmax(cap tanh(z / cap)) in float32 can merge two near-tied z that the
  pass tells apart, so the full head's argmax is not the capped logits' argmax there (Gemma 2's 30.0; Gemma 3's
  GGUF declares none);
- the head has at least `MIN_VOCAB` rows: measured to pay at 262,144 x 640; a smaller head's product costs little
  beside the call's fixed work, and no smaller head was measured.

Then a forward whose rows all want only their argmax (greedy sampling) takes it: by bound and refine when they are at
most `ROWS` rows (measured 1.17-1.44x the full head at one row, median, and 0.79x at 8 rows, where each row
multiplies every tile's bounded blocks on its own), and above that (a speculative verification, a batch of several
slots' rows) as the full product reduced to each row's argmax in the kernel, its logits never written out.

The head is then held once, in the form the pass reads: one stream of 16-row tiles, per tile and block of 32 input
channels its Q8_0 bytes (`EXACT_BLOCKS` blocks) or its high nibbles with a norm byte per row (the others), and the
others' low nibbles apart; the full product, its rows and the exact scores recombine them into the Q8_0 bytes, so
the Q8_0 tiles go. It costs the norm bytes beyond the Q8_0 head (`held_once_extra_bytes`, what sizing charges;
`power.kernels.cpu.greedy` lays it out).
"""

from __future__ import annotations

EXACT_BLOCKS = 6  # blocks of 32 input channels the pass reads in full (docs/runtime.md: 6 of Gemma's 20)
MIN_VOCAB = 65_536
ROWS = 1
BLOCK = 32
TILE = 16  # power/kernels/cpu/layout.py TILE


def refusal(qtype: str, vocab: int, softcap: float | None, cpu_kernels: bool) -> str | None:
    """Why a trunk keeps the full LM head for every row (None: it takes the greedy head for greedy rows)."""
    if not cpu_kernels:
        return "the exact greedy head is a kernel of the CPU path's quantised products"
    if qtype != "Q8_0":
        return f"the LM head is {qtype}; the exact greedy head reads a Q8_0 head"
    if softcap:
        return f"the model caps its final logits ({softcap}): the capped logits' argmax can differ from the head's"
    if vocab < MIN_VOCAB:
        return f"the LM head's {vocab} rows are too few to pay (at least {MIN_VOCAB})"
    return None


def exact_blocks(width: int) -> int:
    """How many of a head's blocks of 32 input channels the pass reads in full."""
    return min(EXACT_BLOCKS, width // BLOCK)


def held_once_extra_bytes(vocab: int, width: int) -> int:
    """What a [vocab, width] Q8_0 head held once for the greedy head holds beyond its Q8_0 tiles: a norm byte per row
    and bounded block."""
    tiles = -(-vocab // TILE)
    return tiles * (width // BLOCK - exact_blocks(width)) * TILE
