"""Atomic writes: a temp file beside the target, renamed onto it, so a crash never leaves half a file.

The file gets the mode a plain `open(path, "w")` would give it: a new file 0666 less the umask (0777
less the umask for an executable), a replaced file keeps its own mode, so a service account the
umask lets in can read what Power writes (a temp file alone would be 0600).
"""

from __future__ import annotations

import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_path(path: Path, executable: bool = False) -> Iterator[Path]:
    """A temp path beside `path`, renamed onto it only when the block completes; removed otherwise."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = _mode(path, executable)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    try:
        yield Path(temp)
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)


def write_text_atomic(path: Path, text: str, executable: bool = False) -> None:
    with atomic_path(path, executable) as temp:
        temp.write_text(text, encoding="utf-8")


def new_mode(executable: bool = False) -> int:
    """The mode `open()` (0666) or `mkdir()` and an executable (0777) would get under the current umask."""
    return (0o777 if executable else 0o666) & ~_umask()


def _mode(path: Path, executable: bool) -> int:
    """The replaced file's own mode (with the execute bits the umask allows, for an executable), else the
    umask's default for a new file."""
    try:
        existing = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return new_mode(executable)
    return existing | (0o111 & ~_umask()) if executable else existing


def _umask() -> int:
    # The only portable way to read the umask is to set it; it is put back at once.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
