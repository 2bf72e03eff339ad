"""The A/B protocol's fixed traffic shapes: prompts that decide who can win.

A proposer can only draft text it has seen, so one prompt shape answers the wrong
question. Each shape here is generated deterministically (same text on every
machine, every run) and says whom it can favour:

- prose: filler + "reply with one sentence" - only model-backed drafters;
- echo: a passage of unique lines to repeat verbatim - n-gram (the output IS the
  prompt); no run of more than three words repeats inside the passage, so the matcher is measured
  against the prompt, not against itself;
- structured: repetitive output whose every line carries a unique id, with no
  passage in the prompt to copy from - n-gram, if spans really repeat;
- identity: a short deterministic question at temperature 0 - the losslessness
  control: configurations must emit the same text;
- writing, code, chat: natural requests (paragraphs and stories, functions, chat
  turns in Gemma's template) from the distiller's held-out set
  (`power/drafters/prompts/heldout.jsonl`, topics and tasks no training prompt
  has) - a learned drafter on the text it was trained to write, and n-gram where
  the target repeats itself. Run r sends the shape's prompt r (of
  HELDOUT_PROMPTS), so `--runs 8` measures eight different requests, each pair
  on the same prompt;
- nonrepeating: held-out prose whose greedy continuations by the bundled Gemma
  leave the n-gram lookup at most a third of their tokens to copy
  (`power/drafters/prompts/nonrepeating.jsonl`, chosen by counting them:
  `bench/select_nonrepeating.py`) - a learned drafter where n-gram has little
  to copy.

Sizes: `power bench` runs the reference sizes (docs/reference.md) (`REFERENCE_PROMPT_TOKENS`: an echo passage
of about 1.5k tokens, prose over about 1k tokens of filler, at about 12 Gemma
tokens per generated line); a caller may size a shape by its answer instead
(`prompt_tokens=None`: just enough passage to echo `max_tokens`).

`python -m power.app.bench.traffic SHAPE [MAX_TOKENS]` prints a shape's prompt.
"""

from __future__ import annotations

import functools
import random
import sys
from dataclasses import dataclass

from power.drafters.prompt_sets import load_prompts

DEFAULT_SHAPES = ("prose", "echo", "structured", "identity")  # the reference A/B protocol (docs/reference.md)
SHAPE_NAMES = (*DEFAULT_SHAPES, "writing", "code", "chat", "nonrepeating")
# a natural shape -> its prompts' label in its packaged set (`heldout`, unless PROMPT_SET_OF names another)
HELDOUT_LABELS = {"writing": "prose", "code": "code", "chat": "chat", "nonrepeating": "prose"}
PROMPT_SET_OF = {"nonrepeating": "nonrepeating"}
HELDOUT_PROMPTS = 8  # prompts a held-out shape cycles through, run by run

# Word pools for the generated passages. Each generated line draws fresh words and is
# rejected if it would repeat a run of more than SPAN_LIMIT words already in the passage.
_DETERMINERS = ("The", "A", "One", "Each", "That", "This", "Every", "Our", "Your", "Their", "My", "His", "Her",
                "Some", "No", "Any")
_ADJECTIVES = (
    "amber silent narrow copper hollow brisk velvet distant gentle rusty golden frozen "
    "crooked patient bitter humble scarlet quiet wooden hidden lucky pale restless "
    "silver stubborn tidy wild ancient clever dusty eager fragile loyal muddy nimble "
    "proud rapid sleepy sturdy tender vivid weary"
).split()
_NOUNS = (
    "falcon lantern harbour orchard violin compass meadow kettle glacier ladder "
    "tram beacon quarry saddle pigeon canyon thimble anchor barrel cobbler ferry "
    "garden hammer island jackal kiln lighthouse mill needle otter parcel quill "
    "raven sailor tunnel umbrella valley wagon yarn zebra"
).split()
_VERBS = (
    "crosses guards paints follows carries mends watches counts polishes lifts "
    "greets measures sketches gathers repairs circles weighs chases unlocks folds "
    "trims buries sorts waters"
).split()
_PLACES = (
    "at dawn|before noon|after the storm|near the bridge|under the arch|beside the well|"
    "along the pier|behind the chapel|across the square|inside the barn|past the gate|"
    "below the ridge|beyond the marsh|around midnight|during the fair|on the roof|"
    "by the river|at the crossroads|in the cellar|over the dunes"
).split("|")

SPAN_LIMIT = 3  # the longest run of words that may occur twice in a generated passage
# The reference A/B sizes (docs/reference.md): echo "~1.5k passage", prose "1k filler" (2/3 of it).
REFERENCE_PROMPT_TOKENS = 1536
TOKENS_PER_LINE = 12  # a generated line is about 12 Gemma tokens (measured: 12.2 over 120 lines)
IDENTITY_QUESTION = "Question: What is the capital of France?\nAnswer:"
IDENTITY_MAX_TOKENS = 16


@dataclass(frozen=True)
class TrafficShape:
    name: str
    prompts: tuple[str, ...]  # run r sends prompts[r % len(prompts)]
    temperature: float
    max_tokens: int
    favours: str  # who this shape can favour, in the protocol's words

    @property
    def prompt(self) -> str:
        """The first run's prompt (a generated shape's only one)."""
        return self.prompts[0]

    def prompt_for(self, run: int) -> str:
        return self.prompts[run % len(self.prompts)]


def build_shape(name: str, max_tokens: int = 128, prompt_tokens: int | None = None) -> TrafficShape:
    """The shape called `name`: its passage about `prompt_tokens` long (echo; prose 2/3 of it), or, without it,
    just long enough that its expected answer can fill `max_tokens`."""
    builders = {"prose": _prose, "echo": _echo, "structured": _structured, "identity": _identity}
    builders |= {shape: functools.partial(_heldout, shape) for shape in HELDOUT_LABELS}
    if name not in builders:
        raise ValueError(f"unknown traffic shape {name!r}: choose from {', '.join(SHAPE_NAMES)}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    if prompt_tokens is not None and prompt_tokens < 1:
        raise ValueError(f"prompt_tokens must be at least 1, got {prompt_tokens}")
    return builders[name](max_tokens, prompt_tokens)


def parse_shapes(text: str) -> list[str]:
    """A comma list of shape names (`prose,echo`), validated, in the order given, without duplicates."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in SHAPE_NAMES]
    if unknown or not names:
        raise ValueError(f"unknown traffic shape(s) {', '.join(unknown) or '(none given)'}: choose from "
                         f"{','.join(SHAPE_NAMES)}")
    return list(dict.fromkeys(names))


def unique_lines(count: int, seed: int) -> list[str]:
    """`count` distinct sentence lines in which no run of SPAN_LIMIT + 1 words occurs twice (across line ends too)."""
    rng = random.Random(seed)
    lines: list[str] = []
    words: list[str] = []
    seen: set[tuple[str, ...]] = set()
    n = SPAN_LIMIT + 1
    for _ in range(count * 1000):
        if len(lines) == count:
            return lines
        line = (f"{rng.choice(_DETERMINERS)} {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)} {rng.choice(_VERBS)} "
                f"the {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)} {rng.choice(_PLACES)}.")
        candidate = words + line.split()
        new_grams = [tuple(candidate[i : i + n]) for i in range(max(0, len(words) - n + 1), len(candidate) - n + 1)]
        if len(set(new_grams)) < len(new_grams) or seen.intersection(new_grams):
            continue
        seen.update(new_grams)
        words = candidate
        lines.append(line)
    raise ValueError(f"cannot draw {count} lines without repeating a {n}-word run: ask for fewer")


def longest_repeated_span(words: list[str]) -> int:
    """Length of the longest run of words that occurs at two different places in `words`."""
    longest = 0
    for n in range(1, len(words)):
        grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
        if len(set(grams)) == len(grams):
            break
        longest = n
    return longest


def _lines_for(max_tokens: int, prompt_tokens: int | None, share: float = 1.0) -> int:
    """Lines for a passage of `prompt_tokens * share` tokens, never fewer than it takes to echo `max_tokens`."""
    answer = max(4, max_tokens // 10)
    return answer if prompt_tokens is None else max(answer, round(prompt_tokens * share / TOKENS_PER_LINE))


def _prose(max_tokens: int, prompt_tokens: int | None) -> TrafficShape:
    filler = " ".join(unique_lines(_lines_for(max_tokens, prompt_tokens, share=2 / 3), seed=1))
    prompt = f"{filler}\n\nReply with one sentence: which of these scenes would you paint first, and why?\nReply:"
    return TrafficShape("prose", (prompt,), 0.0, max_tokens, "model-backed drafters only")


def _echo(max_tokens: int, prompt_tokens: int | None) -> TrafficShape:
    lines = unique_lines(_lines_for(max_tokens, prompt_tokens) + 1, seed=2)
    passage = "\n".join(lines)
    # A base model copies once the copy has started: the prompt opens it with the passage's first line.
    prompt = (f"Repeat the passage below verbatim, line by line.\n\nPassage:\n{passage}\n\n"
              f"The same passage, copied word for word:\n{lines[0]}\n")
    return TrafficShape("echo", (prompt,), 0.0, max_tokens, "n-gram (the output is the prompt)")


def _structured(max_tokens: int, prompt_tokens: int | None) -> TrafficShape:  # noqa: ARG001 - no passage
    prompt = (
        "Write a shipping log with one record per line. Each record gives a unique "
        "six-digit record number counting up from 100001, then the status, the dock "
        "and the carrier, separated by vertical bars.\n\nLog:\n"
    )
    return TrafficShape("structured", (prompt,), 0.0, max_tokens, "n-gram, if spans really repeat")


def _identity(max_tokens: int, prompt_tokens: int | None) -> TrafficShape:  # noqa: ARG001 - a fixed question
    return TrafficShape("identity", (IDENTITY_QUESTION,), 0.0, min(max_tokens, IDENTITY_MAX_TOKENS),
                        "nobody: the losslessness control")


def _heldout(name: str, max_tokens: int, prompt_tokens: int | None) -> TrafficShape:  # noqa: ARG001 - fixed prompts
    label = HELDOUT_LABELS[name]
    which = PROMPT_SET_OF.get(name, "heldout")
    prompts = tuple(p.text for p in load_prompts(which=which) if p.shape == label)[:HELDOUT_PROMPTS]
    favours = ("a learned drafter where n-gram has little to copy" if which == "nonrepeating"
               else "a learned drafter on natural text; n-gram where it repeats")
    return TrafficShape(name, prompts, 0.0, max_tokens, favours)


if __name__ == "__main__":
    print(build_shape(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 128).prompt, end="")
