"""What serving sees: the written drafter, run by the runtime, over the target's held-back text, round by round.

Training's held-back curve (`power.drafters.train.Curve`) counts a round at every
anchor of the text, with the training module's float arithmetic. Serving starts a
round only where the previous one ended (after its accepted drafts and the
target's own token) and runs the file as written through the runtime's speculator
(`power.runtime.speculators`: the CPU kernels' quantised products, the draft
vocabulary, DSpark's confidence cut). This replays that: for each held-back
sequence the target wrote itself, the serving trunk prefills the text once for the
drafter's taps, the prompt's rows are committed, and from the first generated
token on each round proposes K drafts from its anchor, accepts them up to the
first that differs from the target's greedy token, commits the anchor's and the
accepted drafts' rows, and anchors the next round at the token after them: a
greedy decode of that prompt at width K, without the n-gram lookup, the cost
governor or a confidence gate in front (those are the plan's, not the drafter's).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from power.runtime.gguf_weights import GGUFFile
from power.runtime.speculators import registry
from power.runtime.speculators.base import DraftContext, SpeculatorRequest
from power.runtime.trunks import load_trunk

from .budget import Budget
from .generate import Example


@dataclass
class Served:
    """The drafts each round accepted, per width K, over the replayed sequences, and what the replay cost."""

    offered: int = 0  # the sequences the replay was given; it stops at its budget with those it replayed
    sequences: int = 0
    accepted: dict[int, list[int]] = field(default_factory=dict)
    setup_s: float = 0.0  # loading the trunk and the drafter
    pass_s: float = 0.0  # the slowest seconds per token of one width's pass over a sequence (its prefill shared out)

    def tokens_per_round(self, k: int) -> float:
        """What a round commits on average: its accepted drafts and the target's own token."""
        rounds = self.accepted[k]
        return 1.0 + sum(rounds) / len(rounds) if rounds else 0.0

    def sequence_s(self, example: Example, widths: int) -> float:
        """What replaying `example` at `widths` widths costs, at the slowest rate measured."""
        return self.pass_s * len(example.tokens) * widths

    def document(self, estimate: dict[str, float]) -> dict[str, Any]:
        """The served figure per K beside training's estimate (`estimate`: K -> tokens per round) and their ratio."""
        def figures(k: int) -> dict[str, Any]:
            served = self.tokens_per_round(k)
            return {"rounds": len(self.accepted[k]), "estimate": round(estimate[str(k)], 4), "served": round(served, 4),
                    "estimate_over_served": round(estimate[str(k)] / served, 4) if served else None}

        return {"sequences": self.sequences, "offered": self.offered,
                "per_k": {str(k): figures(k) for k in self.accepted}}


def replay(target: Path, drafter: Path, kind: str, sequences: Sequence[Example], widths: Sequence[int],
           budget: Budget | None = None, measured: Served | None = None, reserve_s: float = 0.0) -> Served:
    """The runtime's `kind` drafter from `drafter` over `sequences` (the target's own greedy text: a prompt, whose rows
    are unlabelled, then the target's choices) at each K of `widths`. With `budget`, the first sequence always runs
    (its cost is reserved ahead, from an earlier replay: `measured`) and each later one starts only when its cost at
    the slowest rate measured so far fits beside `reserve_s`, the seconds the work after the replay needs."""
    clock = time.monotonic if budget is None else budget.clock
    started = clock()
    gguf = GGUFFile(target)
    longest = max(len(e.tokens) for e in sequences) + 1
    trunk = load_trunk(gguf, n_ctx=longest, verify_capacity=max(widths) + 1)
    speculator = registry.create(kind, SpeculatorRequest(trunk, target=gguf, drafter=GGUFFile(drafter)))
    served = Served(offered=len(sequences), accepted={k: [] for k in widths}, setup_s=clock() - started,
                    pass_s=0.0 if measured is None else measured.pass_s)
    for example in sequences:
        if served.sequences and budget is not None and not budget.fits(
                served.sequence_s(example, len(widths)) + reserve_s):
            break
        began = clock()
        _replay_one(trunk, speculator, example, widths, served)
        served.pass_s = max(served.pass_s, (clock() - began) / (len(example.tokens) * len(widths)))
        served.sequences += 1
    return served


def _replay_one(trunk, speculator, example: Example, widths: Sequence[int], served: Served) -> None:
    """One sequence, prefilled once for the drafter's taps, then decoded greedily at each width."""
    prompt = example.first_generated
    text = example.tokens[:prompt].tolist() + example.labels[prompt - 1:].tolist()
    trunk.reset()
    hidden = trunk.prefill(text, taps=speculator.taps).hidden
    for k in widths:
        speculator.reset()
        speculator.begin(text[:prompt])
        speculator.commit(text[:prompt], {t: rows[:prompt] for t, rows in hidden.items()}, 0)
        anchor = prompt  # the first generated token: the first round's anchor, not yet in the target
        while anchor + k < len(text):  # the text scores every draft of this round
            drafts = speculator.propose(DraftContext(text[: anchor + 1], k)).tokens[:k]
            accepted = next((i for i, d in enumerate(drafts) if d != text[anchor + 1 + i]), len(drafts))
            landed = slice(anchor, anchor + accepted + 1)
            speculator.commit(text[landed], {t: rows[landed] for t, rows in hidden.items()}, anchor)
            served.accepted[k].append(accepted)
            anchor += accepted + 1
