"""`power drafter distill`'s arguments: the manifest and the drafter to train, the wall-time budget (a duration
parsed here), the text the target reads and writes, and where the result goes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from power.drafters.distill import DistillRequest

DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*$")
SECONDS = {"s": 1, "m": 60, "h": 3600, None: 60}


def parse_budget(text: str) -> float:
    """`20m`, `90s`, `1.5h` or a bare number of minutes -> seconds."""
    match = DURATION.match(text)
    if not match or float(match.group(1)) <= 0:
        raise click.BadParameter(f"{text!r} is not a duration: write 20m, 90s or 1.5h")
    return float(match.group(1)) * SECONDS[match.group(2)]


@dataclass(frozen=True)
class DistillArguments:
    manifest: Path
    out: Path
    kind: str
    fr: int | None
    budget_s: float
    seed: int
    prompts: Path | None
    corpus: Path | None
    corpus_share: float
    max_prompts: int | None
    max_new_tokens: int
    slots: int
    steps: int
    chain_levels: int
    precision: str
    threads: int | None  # torch's threads (None: torch's own choice)
    progress: bool

    def request(self, target: Path, target_sha256: str, began: float) -> DistillRequest:
        """The training pipeline's request for the target as verified against the manifest; its budget began at
        `began` (a `time.monotonic()` instant)."""
        from power.drafters.distill import DistillRequest

        return DistillRequest(target=target, target_sha256=target_sha256, kind=self.kind, out=self.out, fr=self.fr,
                              budget_s=self.budget_s, seed=self.seed, prompts=self.prompts, corpus=self.corpus,
                              corpus_share=self.corpus_share, max_prompts=self.max_prompts,
                              max_new_tokens=self.max_new_tokens, slots=self.slots, max_steps=self.steps,
                              chain_levels=self.chain_levels, precision=self.precision, progress=self.progress,
                              began=began)


def parse_distill(manifest: Path, out: Path, kind: str, fr: int | None, budget: str, seed: int, prompts: Path | None,
                  corpus: Path | None, corpus_share: float, max_prompts: int | None, max_new_tokens: int, slots: int,
                  steps: int, chain_levels: int, precision: str, threads: int | None, quiet: bool) -> DistillArguments:
    """The record of one `power drafter distill`; click.BadParameter (exit 2) for a budget that is not a duration."""
    return DistillArguments(manifest, out, kind, fr, parse_budget(budget), seed, prompts, corpus, corpus_share,
                            max_prompts, max_new_tokens, slots, steps, chain_levels, precision, threads, not quiet)
