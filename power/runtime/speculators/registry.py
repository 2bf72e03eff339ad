"""Which speculation algorithms exist, read from `power.modes`: a mode whose record names a speculator module.

Each speculator module has `build(kind, request) -> Speculator | Decline`: it
either builds a speculator for the target it is given or says why it cannot (no
draft head in the file, a drafter bound to another target, ...). `create` turns
a decline into `SpeculatorDeclined`, so an explicitly requested mode fails
closed instead of silently decoding plainly.
"""

from __future__ import annotations

import importlib

from power import modes

from .base import Decline, Speculator, SpeculatorDeclined, SpeculatorRequest


def names() -> tuple[str, ...]:
    """The modes the runtime can speculate with."""
    return tuple(m.name for m in modes.MODES if m.speculator)


def build(name: str, request: SpeculatorRequest) -> Speculator | Decline:
    """The speculator, or the reason it cannot serve this target."""
    record = modes.BY_NAME.get(name)
    if record is None or record.speculator is None:
        return Decline(name, f"no such speculator; known: {', '.join(names())}")
    module = importlib.import_module(f"{__package__}.{record.speculator}")
    return module.build(name, request)


def create(name: str, request: SpeculatorRequest) -> Speculator:
    """The speculator; raises SpeculatorDeclined (fail closed) when it cannot serve this target."""
    built = build(name, request)
    if isinstance(built, Decline):
        raise SpeculatorDeclined(built)
    return built
