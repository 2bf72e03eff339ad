"""The prompts a drafter is distilled from and measured on: packaged sets, or a file the operator names.

`train` is what `power drafter distill` generates from by default; `heldout`
shares no topic or task with it (docs/drafters.md says how the two were kept
apart) and is what the benches and `power bench`'s natural-text shapes send.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

PROMPT_SETS = ("train", "heldout")


@dataclass(frozen=True)
class Prompt:
    shape: str  # prose, list, chat or code
    text: str


def load_prompts(path: Path | None = None, which: str = "train") -> list[Prompt]:
    """Prompts from a JSON-lines file (`{"shape": ..., "prompt": ...}` or plain lines), else the packaged set."""
    if path is None:
        if which not in PROMPT_SETS:
            raise ValueError(f"no packaged prompt set {which!r}; choose {', '.join(PROMPT_SETS)}")
        text = resources.files(__package__).joinpath("prompts", f"{which}.jsonl").read_text(encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    return [_prompt(line) for line in text.splitlines() if line.strip()]


def _prompt(line: str) -> Prompt:
    if not line.lstrip().startswith("{"):
        return Prompt("text", line)
    record = json.loads(line)
    return Prompt(str(record.get("shape", "text")), str(record["prompt"]))
