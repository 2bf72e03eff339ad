"""Streaming sha256 of artifacts, with a digest cache so an unchanged 22 GB file is hashed once.

The cache maps a file's stamp, (device, inode, size, mtime_ns, ctime_ns), to a digest.
What it trusts: that a file whose stamp is unchanged has unchanged bytes. The mtime alone
is not enough (any user who can write the file can set it back with `touch -d`); the
ctime is, because the kernel sets it on every write, truncate, rename or `utimes`, and no
system call lets a user choose it: only changing the system clock or writing the raw
block device (both privileged) can bring a matching ctime back. A cache entry is used
only when all five match the file as it is now.

The cache only speeds up what hashes artifacts before a plan exists (inspect, plan, the
fleet review, import). Where a plan is launched, rendered or verified (run, serve,
bench, render, verify) every artifact is hashed in full (`use_cache=False`,
`power.artifacts.verify`).

It lives in the user cache directory (`platformdirs`), or in `$POWER_CACHE_DIR` when set
(tests point it at a temp dir), as one JSON file written atomically (temp file + rename).
A cache that cannot be read or parsed is ignored and rebuilt: it only ever saves a hash.

A file that changes while it is hashed (its stamp before vs after, or a short read)
raises ArtifactError with PWR116.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence, Union

from power.artifacts.atomic import write_text_atomic
from power.artifacts.bounded_reader import DocumentError, read_json
from power.artifacts.gguf_reader import ArtifactError, artifact_error, open_regular_file

if TYPE_CHECKING:
    from tqdm import tqdm

__all__ = ["ArtifactError", "cache_path", "file_stamp", "hash_regions", "sha256_file"]

CHUNK_BYTES = 8 << 20
PROGRESS_MIN_BYTES = 100_000_000
CACHE_ENV = "POWER_CACHE_DIR"
CACHE_FILE_NAME = "digests.json"
CACHE_SCHEMA = "power.digest-cache/v2"
CACHE_MAX_ENTRIES = 4096
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def cache_path() -> Path:
    import platformdirs  # here, not at the top: it pulls in tempfile, shutil, bz2 and random (start-up time)

    root = os.environ.get(CACHE_ENV) or platformdirs.user_cache_dir("power", appauthor=False)
    return Path(root) / CACHE_FILE_NAME


def file_stamp(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What must be unchanged for a file's bytes to count as unchanged: device, inode, size, mtime and ctime."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _cache_key(st: os.stat_result) -> str:
    return ":".join(str(part) for part in file_stamp(st))


def _load_cache() -> dict[str, Any]:
    """The cache's entries, or {} when it is missing, unreadable or not what this version writes."""
    try:
        data = read_json(cache_path())
    except DocumentError:
        return {}
    if not isinstance(data, dict) or data.get("schema") != CACHE_SCHEMA or not isinstance(data.get("entries"), dict):
        return {}
    return data["entries"]


def _cached_digest(key: str) -> str | None:
    entry = _load_cache().get(key)
    digest = entry.get("sha256") if isinstance(entry, dict) else None
    return digest if isinstance(digest, str) and _SHA256_HEX.match(digest) else None


def _store(key: str, path: str, digest: str) -> None:
    """Add an entry; the cache is best effort, so a cache directory we cannot write is not an error."""
    entries = _load_cache()
    entries.pop(key, None)
    entries[key] = {"sha256": digest, "path": path}
    kept = dict(list(entries.items())[-CACHE_MAX_ENTRIES:])
    try:
        write_text_atomic(cache_path(), json.dumps({"schema": CACHE_SCHEMA, "entries": kept}))
    except OSError:
        pass


Progress = Union[bool, Callable[[int], None], None]


def _progress_callback(size: int, path: str,
                       progress: Progress) -> tuple[Callable[[int], object] | None, tqdm[Any] | None]:
    """(per-chunk callback, bar to close): a caller's callback, a tqdm bar, or nothing."""
    if callable(progress):
        return progress, None
    show = progress if progress is not None else (size > PROGRESS_MIN_BYTES and sys.stderr.isatty())
    if not show:
        return None, None
    from tqdm import tqdm

    bar = tqdm(total=size, unit="B", unit_scale=True, unit_divisor=1024, desc=f"sha256 {Path(path).name}",
               file=sys.stderr)
    return bar.update, bar


def _hash_open_file(fd: int, size: int, path: str, progress: Progress) -> tuple[str, int]:
    """sha256 of the open file: one reused buffer, readinto, no per-chunk allocation."""
    digest, buffer = hashlib.sha256(), bytearray(CHUNK_BYTES)
    view, total = memoryview(buffer), 0
    callback, bar = _progress_callback(size, path, progress)
    try:
        with os.fdopen(os.dup(fd), "rb", buffering=0) as handle:
            # One byte past the size we started with is enough to see growth; a file still
            # being written must not keep us reading forever.
            while total <= size and (n := handle.readinto(view[:min(CHUNK_BYTES, size + 1 - total)])):
                digest.update(view[:n])
                total += n
                if callback is not None:
                    callback(n)
    finally:
        if bar is not None:
            bar.close()
    return digest.hexdigest(), total


def hash_regions(fd: int, size: int, path: str, regions: Sequence[tuple[int, int]], *,
                 progress: Progress = None) -> tuple[str, list[bytes]]:
    """One sequential read of the open file (`size` bytes when it was opened): its sha256, and the sha256 of each
    (offset, length) region over the same bytes (regions sorted by offset, not overlapping).

    Nothing is kept but the digests: a loader that copies a region into place later hashes its copy against the
    region's digest, so the bytes it runs are the bytes hashed here. A file that grows or shrinks while it is read
    is refused (PWR116).
    """
    whole, buffer = hashlib.sha256(), bytearray(CHUNK_BYTES)
    view, total, pending = memoryview(buffer), 0, 0
    hashers = [hashlib.sha256() for _ in regions]
    callback, bar = _progress_callback(size, path, progress)
    try:
        # One byte past the size we started with is enough to see growth.
        while total <= size and (n := os.preadv(fd, [view[:min(CHUNK_BYTES, size + 1 - total)]], total)):
            whole.update(view[:n])
            pending = _feed_regions(regions, hashers, pending, view[:n], total)
            total += n
            if callback is not None:
                callback(n)
    finally:
        if bar is not None:
            bar.close()
    if total != size:
        raise artifact_error("PWR116", path, f"the file changed while it was read ({size} bytes before, "
                             f"{min(total, size)}{'+' if total > size else ''} read)", "wait until the download or "
                             "copy finishes, then start again", min(total, size))
    return whole.hexdigest(), [hasher.digest() for hasher in hashers]


def _feed_regions(regions: Sequence[tuple[int, int]], hashers: list[Any], first: int, chunk: memoryview,
                  at: int) -> int:
    """Feed each region's part of `chunk` (the file's bytes from `at`) to its hasher; the first region not yet done."""
    end = at + len(chunk)
    index = first
    while index < len(regions):
        offset, length = regions[index]
        if offset >= end:
            break
        lo, hi = max(offset, at), min(offset + length, end)
        if hi > lo:
            hashers[index].update(chunk[lo - at:hi - at])
        if offset + length > end:
            break
        index += 1
    return index


def sha256_file(path: str | os.PathLike[str], *, use_cache: bool = True, progress: Progress = None) -> str:
    """The file's sha256 (hex).

    `use_cache=False` hashes every byte whatever the cache says (the result still refreshes the cache).
    `progress`: None shows a tqdm bar when stderr is a terminal and the file is over 100 MB;
    True/False force it; a callable is called with the byte count of every chunk read.
    """
    name = str(path)
    fd, before = open_regular_file(path)
    try:
        key = _cache_key(before)
        cached = _cached_digest(key) if use_cache else None
        if cached is not None:
            return cached
        digest, total = _hash_open_file(fd, before.st_size, name, progress)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    if total != before.st_size or file_stamp(after) != file_stamp(before):
        raise artifact_error("PWR116", name, f"the file changed while it was hashed ({before.st_size} bytes before, "
                             f"{total} read, {after.st_size} after)", "wait until the download or copy finishes, then "
                             "validate again", min(total, before.st_size))
    _store(key, os.path.abspath(name), digest)
    return digest
