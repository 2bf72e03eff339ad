"""The only place that knows which speculation algorithms exist.

A factory either builds a speculator for the target it is given or returns a
`Decline` saying why it cannot (no draft head in the file, a drafter bound to
another target, ...). `create` turns a decline into `SpeculatorDeclined`, so an
explicitly requested mode fails closed instead of silently decoding plainly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ..contract import Trunk
from .base import Decline, Speculator, SpeculatorDeclined


@dataclass(frozen=True)
class SpeculatorRequest:
    trunk: Trunk
    max_draft: int  # K
    drafter_path: Path | None = None  # an external drafter artifact (dflash, dflash2, dspark)
    target_path: Path | None = None  # the target GGUF (native heads such as mtp live in it)
    options: Mapping[str, Any] = field(default_factory=dict)


Factory = Callable[[SpeculatorRequest], "Speculator | Decline"]


def _ngram(request: SpeculatorRequest) -> Speculator | Decline:
    from .ngram import NGramSpeculator

    return NGramSpeculator(
        min_order=int(request.options.get("ngram_min", 2)), max_order=int(request.options.get("ngram_max", 4))
    )


_FACTORIES: dict[str, Factory] = {
    "ngram": _ngram,
}


def names() -> tuple[str, ...]:
    return tuple(_FACTORIES)


def build(name: str, request: SpeculatorRequest) -> Speculator | Decline:
    """The speculator, or the reason it cannot serve this target."""
    factory = _FACTORIES.get(name)
    if factory is None:
        return Decline(name, f"no such speculator; known: {', '.join(names())}")
    return factory(request)


def create(name: str, request: SpeculatorRequest) -> Speculator:
    """The speculator; raises SpeculatorDeclined (fail closed) when it cannot serve this target."""
    built = build(name, request)
    if isinstance(built, Decline):
        raise SpeculatorDeclined(built)
    return built
