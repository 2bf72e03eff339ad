"""One artifact pulled: left alone when the file is already there with the declared size and sha256; otherwise
taken from huggingface_hub's cache when it holds the file with those digests, or fetched from its source into a
partial file beside the placed ones (which the next run resumes), checked (size, sha256, and the Hub's own sha256
of an LFS file) and only then moved into place with one atomic rename. Bytes that fail a check are deleted, never
placed."""

from __future__ import annotations

import dataclasses
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from power.artifacts import provenance
from power.artifacts.atomic import atomic_path
from power.artifacts.digests import sha256_file
from power.artifacts.pull import hub, transfer
from power.artifacts.pull.errors import PullError

PARTIAL_DIR = ".power-pull"  # beside the placed files: a resumable partial download, never read by an engine


@dataclass(frozen=True)
class Wanted:
    """An artifact the manifest names: where it belongs and what it must be."""

    where: str  # `target`, `drafters[1]`: the manifest key
    path: Path  # where it is placed
    size: int | None
    sha256: str | None
    repo: str | None = None
    revision: str | None = None
    filename: str | None = None
    url: str | None = None
    source_at: str | None = None  # the manifest key holding its `source`, when not `where` (a checkpoint's file)

    @property
    def sourced(self) -> bool:
        return self.repo is not None or self.url is not None


@dataclass(frozen=True)
class Pulled:
    """An artifact in place: what it is, and whether this run fetched it."""

    wanted: Wanted
    size: int
    sha256: str
    fetched: bool
    commit: str | None = None  # the Hub commit it was fetched at
    origin: str | None = None  # hf://repo@commit/file or the URL


def pull(wanted: Wanted) -> Pulled:
    """The artifact in place at `wanted.path`; PullError (PWR134-PWR140) when it cannot be."""
    present = _present(wanted)
    if present is not None:
        return _at_commit(present) if wanted.repo is not None and not provenance.is_commit(wanted.revision) else present
    if not wanted.sourced:
        state = "is not there" if not wanted.path.exists() else "is not the declared file"
        table = wanted.source_at or wanted.where
        raise PullError(f"{wanted.where}: {wanted.path} {state} and no source says where to fetch it", code="PWR140",
                        file=str(wanted.path), where=f"{table}.source",
                        hint=f"add [{table}.source] (repo, revision, filename; or url), or put the file there")
    return _from_hub(wanted) if wanted.repo is not None else _from_url(wanted)


def _present(wanted: Wanted) -> Pulled | None:
    """The file already in place with the declared size and sha256 (its digest from the cache when unchanged)."""
    if wanted.sha256 is None or not _holds(wanted.path, wanted.size, wanted.sha256):
        return None
    return Pulled(wanted, wanted.path.stat().st_size, wanted.sha256, fetched=False)


def _holds(path: Path, size: int | None, sha256: str) -> bool:
    """`path` is a file of `size` (when declared) bytes whose sha256 is `sha256` (from the digest cache when the
    file is unchanged)."""
    return path.is_file() and (size is None or path.stat().st_size == size) and sha256_file(path) == sha256


def _at_commit(present: Pulled) -> Pulled:
    """A file already in place whose revision is a branch or tag: the commit it is at now (for `--pin`), when the
    Hub's sha256 of it is the file's."""
    wanted = present.wanted
    assert wanted.repo is not None and wanted.revision is not None
    file = hub.resolve(wanted.repo, wanted.revision, wanted.filename or wanted.path.name)
    if file.lfs_sha256 is not None and file.lfs_sha256 != present.sha256:
        raise PullError(f"{wanted.where}: {file.label} has sha256 {file.lfs_sha256}, the file in place "
                        f"{present.sha256}: the revision moved on", code="PWR137", where=f"{wanted.where}.sha256",
                        hint="pin the commit that holds this file, or remove the file and its "
                             "sha256 to take the new one")
    return dataclasses.replace(present, commit=file.commit, origin=file.label)


def _from_hub(wanted: Wanted) -> Pulled:
    assert wanted.repo is not None and wanted.revision is not None
    file = hub.resolve(wanted.repo, wanted.revision, wanted.filename or wanted.path.name)
    if file.size is not None:
        _check_size(wanted, file.size, f"the Hub's {file.label} is")
    if file.lfs_sha256 is not None and wanted.sha256 is not None and file.lfs_sha256 != wanted.sha256:
        raise PullError(f"{wanted.where}: the Hub's sha256 of {file.label} is {file.lfs_sha256}, the manifest "
                        f"declares {wanted.sha256}", code="PWR137", where=f"{wanted.where}.sha256",
                        hint="the revision holds another file: check source.revision and source.filename, or "
                             "re-pin with `power pull --pin` if the new file is the one you want")
    expected = wanted.sha256 or file.lfs_sha256
    cached = hub.cached(file)
    if cached is not None and expected is not None and _holds(cached, wanted.size, expected):
        with atomic_path(wanted.path) as temp:
            _link_or_copy(cached, temp)
        return Pulled(wanted, cached.stat().st_size, expected, fetched=True, commit=file.commit, origin=file.label)
    size, digest = _fetched(wanted, file.location, hub.headers(file), file.lfs_sha256)
    return Pulled(wanted, size, digest, fetched=True, commit=file.commit, origin=file.label)


def _from_url(wanted: Wanted) -> Pulled:
    assert wanted.url is not None
    size, digest = _fetched(wanted, wanted.url, {}, None)
    return Pulled(wanted, size, digest, fetched=True, origin=wanted.url)


def _fetched(wanted: Wanted, url: str, headers: dict[str, str], lfs_sha256: str | None) -> tuple[int, str]:
    """The file fetched into its partial file beside the placed ones (resumed from an earlier run's), checked,
    and renamed into place: its size and sha256."""
    partial = wanted.path.parent / PARTIAL_DIR / f"{wanted.path.name}.partial"
    transfer.download(url, partial, wanted.path.name, headers)
    try:
        size, digest = _checked(wanted, partial, lfs_sha256)
    except PullError:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, wanted.path)
    _remove_if_empty(partial.parent)
    return size, digest


def _checked(wanted: Wanted, fetched: Path, lfs_sha256: str | None) -> tuple[int, str]:
    """The fetched file's size and sha256 over every byte, when both are what the manifest (and the Hub) says."""
    size = fetched.stat().st_size
    _check_size(wanted, size, "the fetched file is")
    digest = sha256_file(fetched, use_cache=False)
    expected = wanted.sha256 or lfs_sha256
    if expected is not None and digest != expected:
        whose = "the manifest declares" if wanted.sha256 is not None else "the Hub's LFS sha256 is"
        raise PullError(f"{wanted.where}: the fetched {wanted.path.name} has sha256 {digest}, {whose} {expected}: "
                        "deleted", code="PWR136", where=f"{wanted.where}.sha256",
                        hint="the source served other bytes than the published file: check the source; nothing was "
                             "placed")
    return size, digest


def _check_size(wanted: Wanted, size: int, what: str) -> None:
    if wanted.size is not None and size != wanted.size:
        raise PullError(f"{wanted.where}: {what} {size:,} bytes, the manifest declares {wanted.size:,}",
                        code="PWR135", where=f"{wanted.where}.size",
                        hint="check the source names the published file; nothing was placed")


def _link_or_copy(source: Path, temp: Path) -> None:
    """A hard link to the cached blob where they share a filesystem (no second copy of a large file), else a copy."""
    temp.unlink()
    try:
        os.link(source.resolve(), temp)
    except OSError:
        shutil.copyfile(source, temp)


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass
