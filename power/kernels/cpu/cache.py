"""The CPU kernel cache: one compiled library per instruction path and build key, built atomically, loaded only
when it is what this installation built.

Layout: `root()` (`$POWER_KERNEL_CACHE`, else the user cache directory's `cpu-kernels`), created 0700, holds one
folder `<path>-<key>` per build with the library and `build.json`, the record written at build time (the
library's sha256, its size, the key, torch's version, the seconds the build took).

A build runs under an exclusive `fcntl.flock` on `.<path>-<key>.lock` (the kernel releases it when its holder
dies, however it dies, so a lock left by a killed build is simply free), in a private folder `.build-<path>-
<key>-*` that is renamed into place once the library and its record are complete: a build killed midway
leaves only a private folder, which the next build under the lock removes. A process that finds another
building waits at most `$POWER_KERNEL_BUILD_WAIT` seconds (default 900), saying so, then stops with a finding.

Loading opens the library once, checks that it and its folders are owned by this user (or root, for a cache
an image prebuilt) and writable by no one else, hashes the opened file against its record, and hands the
dynamic loader that same open file (`/proc/self/fd/N`), so the bytes checked are the bytes loaded.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "POWER_KERNEL_CACHE"
WAIT_ENV = "POWER_KERNEL_BUILD_WAIT"
DEFAULT_WAIT_S = 900.0
RECORD = "build.json"
RECORD_SCHEMA = "power.cpu-kernels/v1"
PROGRESS_EVERY_S = 15.0
BUILD_COMMAND = "power kernels build"


class KernelError(RuntimeError):
    """A kernel cache, build or path failure, as a finding's parts: its code (power.codes), message, the file at
    fault and the fix. This layer imports nothing above it; the runtime reports it as a finding
    (power.runtime.errors.kernel_refusal)."""

    code = "PWR622"

    def __init__(self, message: str, *, file: str | None = None, hint: str | None = None) -> None:
        super().__init__(message if hint is None else f"{message}; hint: {hint}")
        self.message, self.file, self.hint = message, file, hint


class KernelCacheError(KernelError):
    """The kernel cache folder cannot be used: not a folder, not ours, or writable by others."""

    code = "PWR620"


class KernelLibraryRefused(KernelError):
    """A library in the cache that this installation did not build as it is (digest, size, owner or mode)."""

    code = "PWR621"


class KernelBuildError(KernelError):
    """The kernels could not be built or loaded."""

    code = "PWR622"


class KernelBuildBusy(KernelError):
    """Another process held the build lock past the wait bound."""

    code = "PWR623"


@dataclass(frozen=True)
class Built:
    """A build in the cache: its folder and record (None when it has none that reads)."""

    folder: Path
    record: dict | None


def root() -> Path:
    override = os.environ.get(CACHE_ENV, "").strip()
    if override:
        return Path(override)
    import platformdirs  # here: it pulls in tempfile, shutil and more (start-up time)

    return Path(platformdirs.user_cache_dir("power")) / "cpu-kernels"


def ensure_root() -> Path:
    """The cache root, created 0700 when missing; refused (PWR620) when it is not a folder we may trust."""
    folder = root()
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        pass  # a file where the folder should be: named below
    except OSError as error:
        raise KernelCacheError(f"the CPU kernel cache {folder} cannot be created: {error.strerror}",
                               file=str(folder), hint=_cache_hint()) from error
    _check_trusted(folder, want_folder=True, error=KernelCacheError)
    return folder


def folder_of(name: str, key: str) -> Path:
    return root() / f"{name}-{key}"


def library_name(namespace: str, key: str) -> str:
    return f"{namespace}_{key}.so"


def built(name: str, key: str) -> Built | None:
    """The build of (path, key) in the cache, if its folder exists (read without checks: for `status`)."""
    folder = folder_of(name, key)
    if not folder.is_dir():
        return None
    try:
        record = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = None
    return Built(folder, record if isinstance(record, dict) else None)


def verify(name: str, key: str, namespace: str) -> Path:
    """The cached library of (path, key) once checked as `load` checks it, without loading it."""
    with _checked(name, key, namespace) as (library, _):
        return library


def load(name: str, key: str, namespace: str, loader: Callable[[str], object]) -> Path:
    """Check the cached library of (path, key) and load it with `loader` (given a path to the opened file).

    Raises KernelLibraryRefused (PWR621) for a library that is not what its record says or that others could
    have written, KernelBuildError (PWR622) when the loader fails.
    """
    with _checked(name, key, namespace) as (library, fd):
        try:
            loader(f"/proc/self/fd/{fd}")
        except OSError as error:
            raise KernelBuildError(f"the {name} CPU kernel library {library} does not load: {error}",
                                   file=str(library), hint=_rebuild_hint(name)) from error
    return library


@contextlib.contextmanager
def _checked(name: str, key: str, namespace: str) -> Iterator[tuple[Path, int]]:
    """The library of (path, key), opened, its folder, record, owner, mode and digest checked: (path, fd)."""
    folder = folder_of(name, key)
    _check_trusted(folder, want_folder=True, error=KernelLibraryRefused)
    record = _read_record(folder)
    library = folder / library_name(namespace, key)
    try:
        fd = os.open(library, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        raise KernelLibraryRefused(f"the {name} CPU kernel library {library} cannot be opened: {error.strerror}",
                                   file=str(library), hint=_rebuild_hint(name)) from error
    try:
        _check_stat(library, os.fstat(fd), want_folder=False, error=KernelLibraryRefused)
        digest, size = _hash_fd(fd)
        if (digest, size) != (record.get("sha256"), record.get("bytes")):
            raise KernelLibraryRefused(
                f"the {name} CPU kernel library {library} is not the one this installation built: {size} bytes "
                f"with sha256 {digest[:16]}..., its build record says {record.get('bytes')} bytes with sha256 "
                f"{str(record.get('sha256'))[:16]}... (truncated, replaced or corrupted); it was not loaded",
                file=str(library), hint=_rebuild_hint(name))
        yield library, fd
    finally:
        os.close(fd)


def build(name: str, key: str, namespace: str, compile_into: Callable[[Path], None], *, force: bool = False) -> None:
    """Build (path, key) unless it is in the cache (or with `force`, again), atomically, under the build lock.

    `compile_into(folder)` compiles the library into a private folder. Another process building the same key is
    waited for (bounded); a private folder left by a killed build is removed.
    """
    cache = ensure_root()
    final = folder_of(name, key)
    with _build_lock(cache / f".{name}-{key}.lock", name):
        for stale in cache.glob(f".build-{name}-{key}-*"):
            shutil.rmtree(stale, ignore_errors=True)  # we hold the lock: no live build owns it
        if final.exists() and not force:
            return
        private = Path(tempfile.mkdtemp(prefix=f".build-{name}-{key}-", dir=cache))  # 0700
        started = time.monotonic()
        try:
            with _progress(name):
                compile_into(private)
        except BaseException:
            shutil.rmtree(private, ignore_errors=True)
            raise
        library = private / library_name(namespace, key)
        with open(library, "rb") as opened:
            digest, size = _hash_fd(opened.fileno())
        os.chmod(library, 0o700)
        record = {"schema": RECORD_SCHEMA, "path": name, "key": key, "library": library.name, "sha256": digest,
                  "bytes": size, "built_s": round(time.monotonic() - started, 1), "pid": os.getpid()}
        with open(os.open(private / RECORD, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as written:
            written.write(json.dumps(record, indent=2) + "\n")
        if final.exists():  # forced: the old build leaves as a private folder, removed at once
            retired = Path(tempfile.mkdtemp(prefix=f".build-{name}-{key}-", dir=cache))
            os.replace(final, retired / "old")
            shutil.rmtree(retired, ignore_errors=True)
        os.replace(private, final)


def wait_bound_s() -> float:
    text = os.environ.get(WAIT_ENV, "").strip()
    try:
        return float(text) if text else DEFAULT_WAIT_S
    except ValueError as error:
        raise KernelCacheError(f"{WAIT_ENV}={text!r} is not a number of seconds",
                               hint=f"set {WAIT_ENV} to seconds (default {DEFAULT_WAIT_S:.0f}) or unset it") from error


@contextlib.contextmanager
def _build_lock(path: Path, name: str) -> Iterator[None]:
    """The exclusive build lock, waited for at most `wait_bound_s()` (saying so after a second)."""
    bound = wait_bound_s()
    try:
        lock = open(path, "a+")
    except OSError as error:
        raise KernelCacheError(
            f"the {name} CPU kernels are not built and cannot be built into {path.parent}: {error.strerror}",
            file=str(path.parent),
            hint=f"build them where the cache is writable (`{BUILD_COMMAND} --path {name}`), set {CACHE_ENV} to a "
                 f"writable folder, or POWER_CPU_PATH to a path this cache holds (`power kernels status`)") from error
    with lock:
        started, said = time.monotonic(), False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - started
                if waited >= bound:
                    raise KernelBuildBusy(
                        f"another process has been building the {name} CPU kernels for over {bound:.0f} s "
                        f"(it holds {path}); gave up waiting", file=str(path),
                        hint=f"let that build finish (or stop it) and start again; {WAIT_ENV} sets the wait in "
                             f"seconds") from None
                if not said and waited >= 1:
                    print(f"power: another process is building the {name} CPU kernels; waiting for it (at most "
                          f"{bound:.0f} s, {WAIT_ENV})", file=sys.stderr, flush=True)
                    said = True
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def _progress(name: str) -> Iterator[None]:
    """A line on stderr when the build starts, every PROGRESS_EVERY_S while it runs, and when it ends."""
    started, done = time.monotonic(), threading.Event()
    print(f"power: compiling the {name} CPU kernels (once per installation and torch version; "
          f"`{BUILD_COMMAND}` does it ahead of time)", file=sys.stderr, flush=True)

    def tick() -> None:
        while not done.wait(PROGRESS_EVERY_S):
            print(f"power: still compiling the {name} CPU kernels ({time.monotonic() - started:.0f} s)",
                  file=sys.stderr, flush=True)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
    print(f"power: compiled the {name} CPU kernels in {time.monotonic() - started:.0f} s", file=sys.stderr,
          flush=True)


def _read_record(folder: Path) -> dict:
    path = folder / RECORD
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        raise KernelLibraryRefused(f"the CPU kernel build {folder} has no readable build record ({error.strerror})",
                                   file=str(path), hint=_rebuild_hint(folder.name.rsplit("-", 1)[0])) from error
    with open(fd, "rb") as opened:
        _check_stat(path, os.fstat(opened.fileno()), want_folder=False, error=KernelLibraryRefused)
        text = opened.read(1 << 16)
    try:
        record = json.loads(text)
    except ValueError:
        record = None
    if not isinstance(record, dict) or record.get("schema") != RECORD_SCHEMA:
        raise KernelLibraryRefused(f"the build record {path} is not one this installation writes",
                                   file=str(path), hint=_rebuild_hint(folder.name.rsplit("-", 1)[0]))
    return record


def _check_trusted(path: Path, *, want_folder: bool, error: type[KernelError]) -> None:
    try:
        info = os.lstat(path)
    except OSError as failure:
        raise error(f"{path} cannot be read: {failure.strerror}", file=str(path), hint=_cache_hint()) from failure
    _check_stat(path, info, want_folder=want_folder, error=error)


def _check_stat(path: Path, info: os.stat_result, *, want_folder: bool, error: type[KernelError]) -> None:
    """Refuse `path` unless it is a folder (or a regular file), owned by this user or root, writable by no one else."""
    kind = "folder" if want_folder else "regular file"
    if not (stat.S_ISDIR if want_folder else stat.S_ISREG)(info.st_mode):
        raise error(f"{path} is not a {kind} (the CPU kernel cache keeps its builds in folders of regular files)",
                    file=str(path), hint=_cache_hint())
    if info.st_uid not in (os.getuid(), 0):
        raise error(f"{path} belongs to user {info.st_uid}, not to this user ({os.getuid()}) or root; "
                    f"Power loads no code another user could have written", file=str(path), hint=_cache_hint())
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise error(f"{path} can be written by others (mode {stat.S_IMODE(info.st_mode):04o}); Power loads no "
                    f"code another user could have written", file=str(path),
                    hint=f"`chmod go-w {path}` if its contents are yours, or remove it and run `{BUILD_COMMAND}`")


def _hash_fd(fd: int) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, 1 << 20):
        digest.update(chunk)
        size += len(chunk)
    os.lseek(fd, 0, os.SEEK_SET)
    return digest.hexdigest(), size


def _cache_hint() -> str:
    return (f"point {CACHE_ENV} at a folder of your own (created 0700 when missing), or remove what is in the way, "
            f"then run `{BUILD_COMMAND}`")


def _rebuild_hint(name: str) -> str:
    return f"rebuild it: `{BUILD_COMMAND} --path {name} --force` (this replaces the refused build)"
