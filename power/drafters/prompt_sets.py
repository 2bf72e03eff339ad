"""The prompts a drafter is distilled from and measured on: packaged sets, or a file the operator names.

`train` is what `power drafter distill` generates from by default; `heldout`
shares no topic or task with it (docs/drafters.md says how the two were kept
apart) and is what the benches and `power bench`'s natural-text shapes send;
`nonrepeating` is held-out prose whose greedy continuations by the bundled Gemma
3 270M leave an n-gram lookup little to copy (`bench/select_nonrepeating.py`
chose them by counting).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

from power.artifacts.bounded_reader import DocumentError, parse_json, read_text

PROMPT_SETS = ("train", "heldout", "nonrepeating")
MAX_PROMPTS_BYTES = 64 << 20
MAX_CORPUS_BYTES = 256 << 20  # read whole and tokenised before generating: an operator's text, not a data set
NONREPEATING_COPYABLE = (
    42  # of a `nonrepeating` prompt's 128-token continuation, the most an n-gram lookup could copy (a third)
)


@dataclass(frozen=True)
class Prompt:
    shape: str  # prose, list, chat or code
    text: str


def load_prompts(path: Path | None = None, which: str = "train") -> list[Prompt]:
    """Prompts from a JSON-lines file (`{"shape": ..., "prompt": ...}` or plain lines), else the packaged set. The
    file is read with the project's bounded reader (`read_input`); a line that is not a prompt is a ValueError
    that names the file and the line."""
    if path is None:
        if which not in PROMPT_SETS:
            raise ValueError(f"no packaged prompt set {which!r}; choose {', '.join(PROMPT_SETS)}")
        text = resources.files(__package__).joinpath("prompts", f"{which}.jsonl").read_text(encoding="utf-8")
        return [_prompt(line, f"the {which} prompt set", number) for number, line in _lines(text)]
    text = read_input(path, MAX_PROMPTS_BYTES)
    return [_prompt(line, str(path), number) for number, line in _lines(text)]


def longest_repeat(tokens: Sequence[int], start: int) -> int:
    """The longest run of `tokens` ending at a position >= `start` that also ends at an earlier position: what an
    n-gram lookup can copy there (with a window of w tokens, a repeat of w + n tokens lets it land n drafts)."""
    best = 0
    previous = [0] * len(tokens)  # previous[i]: the common run ending at i and at the row's position - 1
    for j in range(1, len(tokens)):
        current = [0] * len(tokens)
        for i in range(j):
            if tokens[i] == tokens[j]:
                current[i] = (previous[i - 1] if i else 0) + 1
        if j >= start:
            best = max(best, *current[:j])
        previous = current
    return best


def copyable(tokens: Sequence[int], start: int, window: int) -> int:
    """Tokens at positions >= `start` that a lookup of the last `window` tokens could copy: the `window` + 1 tokens
    ending there occurred earlier (what n-gram lookup drafts right)."""
    seen: set[tuple[int, ...]] = set()
    count = 0
    for end in range(window + 1, len(tokens) + 1):
        gram = tuple(tokens[end - window - 1 : end])
        count += end - 1 >= start and gram in seen
        seen.add(gram)
    return count


def read_input(path: Path, limit: int) -> str:
    """A text file an operator gives distill: a regular UTF-8 file of at most `limit` bytes (no FIFO, no device)."""
    try:
        return read_text(path, limit)
    except DocumentError as err:
        where = f":{err.line}:{err.col}" if err.line else ""
        raise ValueError(f"{path}{where}: {err.message}") from None


def json_line(line: str, source: str, number: int) -> dict[str, Any]:
    """One JSON-lines record: an object, or a ValueError at `source:number`."""
    try:
        record = parse_json(line)
    except DocumentError as err:
        raise ValueError(f"{source}:{number}: {err.message}") from None
    if not isinstance(record, dict):
        raise ValueError(f"{source}:{number}: a JSON line must be an object, not {type(record).__name__}")
    return record


def _lines(text: str) -> list[tuple[int, str]]:
    return [(number, line) for number, line in enumerate(text.splitlines(), start=1) if line.strip()]


def _prompt(line: str, source: str, number: int) -> Prompt:
    if not line.lstrip().startswith("{"):
        return Prompt("text", line)
    record = json_line(line, source, number)
    if not isinstance(record.get("prompt"), str):
        raise ValueError(f"{source}:{number}: a JSON line needs a \"prompt\" string")
    return Prompt(str(record.get("shape", "text")), record["prompt"])
