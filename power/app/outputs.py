"""Output paths, checked before a command does its work: a plan compiled, a model run or a fleet reviewed is
never lost to a path that cannot be written (`/proc/x.json`, a directory, a folder that does not exist).

Every command with an output option calls `require_outputs` first: it ends the command (exit 2) with an
OutputError finding (PWR018) that says why. The write itself stays atomic (power.artifacts.atomic).
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from power.app.cli import refuse
from power.findings import PowerError


class OutputError(PowerError):
    """An output path that cannot be written; the message says why, the hint what to pass instead."""

    code = "PWR018"


def require_outputs(files: tuple[str | os.PathLike[str] | None, ...] = (),
                    directories: tuple[str | os.PathLike[str] | None, ...] = (),
                    trees: tuple[str | os.PathLike[str] | None, ...] = (), as_json: bool = False) -> None:
    """End the command with the finding of the first output that cannot be written (None: not asked for).
    `trees` are folders a command replaces whole (`replaceable_tree`)."""
    try:
        for path in files:
            if path is not None:
                output_file(path)
        for path in directories:
            if path is not None:
                output_directory(path)
        for path in trees:
            if path is not None:
                replaceable_tree(path)
    except OutputError as err:
        refuse(err, as_json)


@contextmanager
def writing(path: str | os.PathLike[str], as_json: bool = False) -> Iterator[None]:
    """Around the write itself: a failure checked paths can still meet (the disk filled, the folder went away)
    ends the command with its finding, not a traceback; the atomic write leaves nothing behind."""
    try:
        yield
    except OSError as err:
        refuse(OutputError(f"cannot write {path} ({err.strerror or err})", file=str(path),
                           hint="nothing was written; free space or choose another path"), as_json)


def output_file(path: str | os.PathLike[str]) -> Path:
    """`path`, if a file can be written there: its folder exists and takes new files, and it is not a directory
    or a special file (it may be an existing regular file, which the write replaces)."""
    path = Path(path)
    if path.exists() and not path.is_file():
        kind = "a directory" if path.is_dir() else "not a regular file"
        raise OutputError(f"{path} is {kind}", file=str(path), hint="name a file to write, e.g. out/plan.json")
    folder = path.parent
    if not folder.is_dir():
        raise OutputError(f"the folder {folder} does not exist", file=str(path),
                          hint="create it first, or choose a path in an existing folder")
    _probe(folder, path)
    return path


def output_directory(path: str | os.PathLike[str]) -> Path:
    """`path`, if files can be written in it: an existing directory that takes new files, or a new one whose
    nearest existing ancestor does (it is created when written)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"{path} exists and is not a directory", file=str(path), hint="name a directory")
    existing = next(folder for folder in (path, *path.absolute().parents) if folder.exists())
    if not existing.is_dir():
        raise OutputError(f"{existing} is not a directory", file=str(path), hint="name a directory")
    _probe(existing, path)
    return path


def replaceable_tree(path: str | os.PathLike[str]) -> Path:
    """`path`, if a command may replace it whole: a new or empty folder, or one Power rendered (it holds the render
    marker); never the working directory or one of its parents."""
    path = output_directory(path)
    resolved, here = path.resolve(), Path.cwd().resolve()
    if resolved == here or resolved in here.parents:
        raise OutputError(f"{path} is the working directory or one of its parents: it would be replaced whole",
                          file=str(path), hint="name a folder of its own, e.g. deploy/k8s")
    from power.orchestrator.kubernetes.tree import RENDER_MARKER  # the plan models and the engines: not for `--help`

    return owned_folder(path, RENDER_MARKER, "render", "replaced whole")


def owned_folder(path: str | os.PathLike[str], marker: str, command: str, fate: str = "overwritten") -> Path:
    """`path`, if `command` may write over what is in it: a new or empty folder, or one an earlier `command` wrote
    (it holds `marker`): files Power did not write are never `fate`."""
    path = output_directory(path)
    resolved = path.resolve()
    if resolved.is_dir() and any(resolved.iterdir()) and not (resolved / marker).is_file():
        raise OutputError(f"{path} is a folder Power did not {command} (it has no {marker}): its files would be "
                          f"{fate}", file=str(path),
                          hint=f"name a new or empty folder, or one an earlier {command} wrote; nothing was touched")
    return path


def _probe(folder: Path, path: Path) -> None:
    """Create and remove a file in `folder`: the one test that permissions, read-only and pseudo file systems
    (`/proc`) and full disks all answer truthfully."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".power-write-check-", dir=folder)
    except OSError as err:
        raise OutputError(f"cannot write in {folder} ({err.strerror or err})", file=str(path),
                          hint="choose a path in a folder you can write to") from None
    os.close(fd)
    os.unlink(probe)
