"""An untrained drafter of each kind for a target: the weights a distillation starts from, written as it writes them.

Its drafts are what random weights propose, so it (almost) never lands one: the
control that shows what a drafter that cannot win costs a plan (issue 41,
`bench/bench_parked.py`, `tests/test_parked.py`).
"""

from __future__ import annotations

from pathlib import Path

from power.runtime.gguf_weights import GGUFFile

from .distill import DistillRequest, recipe


def write_untrained(kind: str, target: Path, path: Path, seed: int = 0) -> Path:
    """The `kind` drafter (mtp, dflash or dspark) for `target` at the initial weights `power drafter distill` trains
    from, written to `path` the way distill writes one."""
    source = GGUFFile(target)
    how = recipe(DistillRequest(target, kind, path.parent), source)
    objective = how.objective(source, None, longest=1, seed=seed)
    return how.write(path, objective.net, target, "untrained", None)
