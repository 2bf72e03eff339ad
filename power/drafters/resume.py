"""The resume folder's states: keyed by what made them, stored as files that cannot run code.

A state is two files: `NAME.json`, the key of the inputs that made it (JSON, read with the
project's bounded reader), and `NAME.pt`, plain tensors, numbers, strings, lists and dicts
written by `torch.save` and read back with `weights_only=True` (torch's restricted unpickler,
which builds no object but those; a pickled callable is refused, not called). The key is
compared before the tensors are opened, so a state some other run left behind is never read;
a state whose key matches but whose tensors are not plain data is refused with the fix, not
skipped. Resume folders travel between machines, which is why nothing in them is trusted.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import torch

from power.artifacts.atomic import atomic_path, write_text_atomic
from power.artifacts.bounded_reader import DocumentError, Reason, read_json

MAX_KEY_BYTES = 4096


class ResumeError(ValueError):
    """A resume state whose key matches this run but whose contents cannot be used."""


def save(path: Path, key: str, state: dict[str, Any]) -> None:
    """`state` (plain data) at `path`, then its key beside it: a key on disk always names a complete state."""
    key_path(path).unlink(missing_ok=True)
    with atomic_path(path) as temp:
        torch.save(state, temp)
    write_text_atomic(key_path(path), json.dumps({"key": key}) + "\n")


def load(path: Path, key: str) -> dict[str, Any] | None:
    """The state at `path` when its key is `key`; None when there is none or another run's inputs made it."""
    if stored_key(path) != key:
        return None
    try:
        state = torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        raise invalid(path, "holds more than plain tensors, numbers and strings (a pickled object, which Power "
                            "never loads)") from None
    except (RuntimeError, OSError, EOFError, ValueError) as err:
        raise invalid(path, f"cannot be read ({_first_line(err)})") from None
    if not isinstance(state, dict):
        raise invalid(path, f"holds a {type(state).__name__}, not a table of tensors")
    return state


def invalid(path: Path, why: str) -> ResumeError:
    return ResumeError(f"{path} {why}; delete {path.parent} to start over")


def stored_key(path: Path) -> str | None:
    try:
        document = read_json(key_path(path), MAX_KEY_BYTES)
    except DocumentError as err:
        if err.reason is Reason.MISSING:
            return None
        raise ResumeError(f"{key_path(path)}: {err.message}; delete {path.parent} to start over") from None
    key = document.get("key") if isinstance(document, dict) else None
    return key if isinstance(key, str) else None


def discard(path: Path) -> None:
    key_path(path).unlink(missing_ok=True)
    path.unlink(missing_ok=True)


def key_path(path: Path) -> Path:
    return path.with_suffix(".json")


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
