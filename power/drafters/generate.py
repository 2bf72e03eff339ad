"""Training data for a drafter: the target's tapped rows and greedy choices, from its own text or from a corpus.

Self-distillation: the target continues each prompt greedily, several prompts
side by side (one per trunk slot, all in one forward per step), and every row's
tapped residuals and argmax are kept. A corpus costs prefill time instead: its
text runs through the target in chunks, and each row's argmax is what the target
would have said there.

An `Example` holds one sequence: its tokens, the target's greedy next token at
every position (-1 where it was not computed: prompt rows), and the tapped rows
(bfloat16, the taps side by side).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from power.runtime.tokenizer import Tokenizer
from power.runtime.trunks.base import FixedShapeTrunk, Part

from .progress import BudgetBar
from .prompt_sets import MAX_CORPUS_BYTES, Prompt, json_line, read_input

NO_LABEL = -1
NOT_SCORED = -1  # the accepted drafts at a position whose round the text cannot score to the end
FIELDS = ("tokens", "labels", "features")


@dataclass
class Example:
    tokens: torch.Tensor  # [T] int64
    labels: torch.Tensor  # [T] int64: the target's greedy next token after position t, or NO_LABEL
    features: torch.Tensor  # [T, taps * d] bfloat16 (Gemma's residuals overflow float16)

    @property
    def first_generated(self) -> int:
        """The position of the first token the target wrote after the prompt, whose rows are unlabelled but the last
        (the prompt's last row is labelled with that token): where serving lays its first round."""
        return int((self.labels == NO_LABEL).sum()) + 1

    def plain(self) -> dict[str, torch.Tensor]:
        """The example as a table of tensors (what a resume file stores)."""
        return {name: getattr(self, name) for name in FIELDS}

    @classmethod
    def from_plain(cls, row: Any, vocab: int, width: int) -> Example:
        """An example from `plain()`'s table read back from a file: its shapes, types and token IDs checked against
        the target's vocabulary and the taps' `width`, so that training cannot index past them."""
        if not isinstance(row, dict) or not all(isinstance(row.get(name), torch.Tensor) for name in FIELDS):
            raise ValueError(f"a row is not a table of {', '.join(FIELDS)} tensors")
        tokens, labels, features = (row[name] for name in FIELDS)
        if (
            tokens.dtype != torch.int64
            or labels.dtype != torch.int64
            or tokens.dim() != 1
            or labels.shape != tokens.shape
        ):
            raise ValueError("a row's tokens and labels are not two int64 vectors of one length")
        if features.dtype != torch.bfloat16 or tuple(features.shape) != (len(tokens), width):
            raise ValueError(f"a row's features are not bfloat16 [{len(tokens)}, {width}]")
        if len(tokens) and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab or int(labels.min()) < NO_LABEL
                            or int(labels.max()) >= vocab):
            raise ValueError(f"a row has a token ID outside the target's vocabulary of {vocab}")
        return cls(tokens, labels, features)


def self_generated(trunk: FixedShapeTrunk, tokenizer: Tokenizer, prompts: Sequence[Prompt], taps: Sequence[int],
                   max_new: int, deadline: float | None = None, progress: bool = True) -> list[Example]:
    """The target's greedy continuations, one prompt per slot, every slot's next row in one forward.

    At `deadline` (a `time.monotonic()` instant) generation ends: the sequences in flight are kept as far as
    they got (every row of them is a valid greedy row)."""
    slots, stops = trunk.options.slots, tokenizer.stop_ids
    queue = [tokenizer.encode(p.text)[: trunk.config.n_ctx - max_new] for p in prompts]
    queue.reverse()
    active: dict[int, _Growing] = {}
    done: list[Example] = []
    bar = BudgetBar("generate", deadline, len(queue), "prompt", progress)
    while queue or active:
        for slot in range(slots):
            if slot not in active and queue and (deadline is None or time.monotonic() < deadline):
                active[slot] = _start(trunk, slot, queue.pop(), taps)
        if not active:
            break
        order = sorted(active)
        outs = trunk.forward_parts([Part(slot, [active[slot].tokens[-1]]) for slot in order], taps)
        for slot, out in zip(order, outs, strict=True):
            growing = active[slot]
            growing.add(int(out.logits[0].argmax()), torch.cat([out.hidden[t] for t in taps], dim=-1))
            ended = deadline is not None and time.monotonic() >= deadline
            if growing.labels[-1] in stops or growing.new >= max_new or ended:
                done.append(growing.example())
                del active[slot]
                bar.advance(prompts=f"{len(done)}/{len(done) + len(active) + len(queue)}",
                            tokens=sum(len(e.tokens) for e in done))
    bar.close()
    return done


@dataclass
class _Growing:
    tokens: list[int]
    labels: list[int]
    rows: list[torch.Tensor]
    new: int = 0

    def add(self, label: int, row: torch.Tensor) -> None:
        """The row just computed (for the last token) and the target's choice after it, which is the next token."""
        self.rows.append(row.to(torch.bfloat16))
        self.labels.append(label)
        self.new += 1
        self.tokens.append(label)

    def example(self) -> Example:
        # The last token has no row yet: the sequence ends at the last row the target computed.
        return Example(torch.tensor(self.tokens[:-1]), torch.tensor(self.labels), torch.cat(self.rows))


def _start(trunk: FixedShapeTrunk, slot: int, prompt: list[int], taps: Sequence[int]) -> _Growing:
    trunk.reset(slot)
    out = trunk.prefill(prompt[:-1], taps, slot=slot) if len(prompt) > 1 else None
    rows = [torch.cat([out.hidden[t] for t in taps], dim=-1).to(torch.bfloat16)] if out is not None else []
    return _Growing(tokens=list(prompt), labels=[NO_LABEL] * (len(prompt) - 1), rows=rows)


def corpus_examples(trunk: FixedShapeTrunk, tokenizer: Tokenizer, texts: Iterable[str], taps: Sequence[int],
                    window: int, deadline: float | None = None, progress: bool = True) -> list[Example]:
    """The target's rows and argmax over operator text, `window` tokens at a time (prefill speed)."""
    ids = [token for text in texts for token in tokenizer.encode(text)]
    pieces = [ids[i:i + window] for i in range(0, len(ids), window) if len(ids[i:i + window]) > 1]
    examples: list[Example] = []
    bar = BudgetBar("corpus", deadline, len(pieces), "window", progress)
    for piece in pieces:
        if deadline is not None and time.monotonic() >= deadline:
            break
        trunk.reset(0)
        out = trunk.prefill(piece, taps, all_logits=True, slot=0)
        features = torch.cat([out.hidden[t] for t in taps], dim=-1).to(torch.bfloat16)
        examples.append(Example(torch.tensor(piece), out.logits.argmax(dim=-1), features))
        bar.advance(windows=f"{len(examples)}/{len(pieces)}")
    bar.close()
    return examples


def read_corpus(path: Path) -> list[str]:
    """A corpus file: plain text split at blank lines, or JSON lines with a `text` (or `prompt`) string; read with
    the bounded reader (`prompt_sets.read_input`), a line that is not a record named by its number."""
    text = read_input(path, MAX_CORPUS_BYTES)
    if not text.lstrip().startswith("{"):
        return [part for part in text.split("\n\n") if part.strip()]
    texts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            record = json_line(line, str(path), number)
            value = record.get("text", record.get("prompt"))
            if not isinstance(value, str):
                raise ValueError(f"{path}:{number}: a JSON line needs a \"text\" (or \"prompt\") string")
            texts.append(value)
    return texts


def token_count(examples: Sequence[Example]) -> int:
    return sum(len(e.tokens) for e in examples)

