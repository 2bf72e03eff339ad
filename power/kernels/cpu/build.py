"""The instruction paths of the CPU kernels: which this CPU has, and one compiled extension per path.

Each path is a build of `csrc/qmatmul.cpp` (the products), `csrc/rowops.cpp` (norm, rope, attention, the cache
write), `csrc/pool.cpp` (the threads they run on, waiting as `waits.kernel_wait` says), `csrc/greedyhead.cpp` (the
greedy head's cheap pass) and `csrc/layer.cpp` (a Gemma 3 layer as one call of those ops) with its own `-m` flags,
compiled with `torch.utils.cpp_extension.load` into the kernel cache
(`power.kernels.cpu.cache`: built atomically under a lock, loaded only after its digest, owner and mode are checked),
keyed by a hash of the sources, the flags and the torch version. `power kernels build` (and `scripts/bootstrap`) builds
ahead of time; a first use that finds no build compiles it then, saying so. The amx path also needs Linux's leave to
use AMX tile data, asked for (once per process) when the paths are listed.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import hashlib
import os
import platform
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch

from power.kernels.cpu import cache
from power.kernels.cpu.waits import KERNEL_SPIN_US, KERNEL_WAITS, KernelWait, kernel_wait

CSRC = Path(__file__).parent / "csrc"
COMPILED = ("qmatmul.cpp", "rowops.cpp", "pool.cpp", "greedyhead.cpp", "layer.cpp")
SOURCES = (*COMPILED, "simd.h", "amx.h", "pool.h", "quantize.h", "ops.h")  # the headers are included
ENV_PATH = "POWER_CPU_PATH"


class Path_(NamedTuple):
    """An instruction path: the /proc/cpuinfo flags it needs, the compiler flags of its build, and whether it
    needs Linux's leave to use AMX tile data."""

    name: str
    cpu_flags: tuple[str, ...]
    cflags: tuple[str, ...]
    tile_data: bool = False


AVX512VNNI_CPU = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")
AVX512VNNI_CFLAGS = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c")
# Best first. amx is the avx512vnni build plus the tile kernels (csrc/amx.h), which it takes for calls of
# several rows, where they are faster; below that it runs the avx512vnni code.
PATHS: tuple[Path_, ...] = (
    Path_("amx", (*AVX512VNNI_CPU, "amx_tile", "amx_int8"),
          (*AVX512VNNI_CFLAGS, "-mamx-tile", "-mamx-int8", "-DPOWER_PATH_AVX512VNNI", "-DPOWER_PATH_AMX"), True),
    Path_("avx512vnni", AVX512VNNI_CPU, (*AVX512VNNI_CFLAGS, "-DPOWER_PATH_AVX512VNNI")),
    Path_("avxvnni", ("avx2", "f16c", "avx_vnni"), ("-mavx2", "-mf16c", "-mavxvnni", "-DPOWER_PATH_AVXVNNI")),
    Path_("avx2", ("avx2", "f16c"), ("-mavx2", "-mf16c", "-DPOWER_PATH_AVX2")),
    Path_("scalar", (), ()),
)
PATH_NAMES = tuple(path.name for path in PATHS)
# -ffp-contract=off: a multiply and an add stay two roundings (no FMA), as in the torch reference. The sources
# compile without a warning under -Wall -Wextra on every path (tests/test_kernel_cpu_build.py).
COMMON_CFLAGS = ("-O3", "-std=c++20", "-ffp-contract=off", "-fno-fast-math", "-fopenmp", "-Wall", "-Wextra")


class CPUPathError(cache.KernelError):
    """A requested instruction path that this CPU cannot run, or an unknown path name."""

    code = "PWR624"


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The flags of the first processor in /proc/cpuinfo (empty when there is none to read)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


# Linux's arch_prctl(2) request for a dynamically enabled state component (arch/x86/include/uapi/asm/prctl.h),
# on x86-64 (arch/x86/entry/syscalls/syscall_64.tbl).
SYS_ARCH_PRCTL = 158
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18


@functools.cache
def tile_data_refusal() -> str | None:
    """None once Linux lets this process use AMX tile data, else why not.

    The first call asks (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, for every thread of the process);
    the kernel requires that before a thread's first tile instruction (Documentation/arch/x86/xstate.rst).
    """
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return f"AMX tile data is requested from Linux on x86-64; this is {platform.system()} on {platform.machine()}"
    syscall = ctypes.CDLL(None, use_errno=True).syscall
    syscall.argtypes, syscall.restype = [ctypes.c_long] * 3, ctypes.c_long  # syscall(2) reads longs
    if syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0:
        return None
    code = ctypes.get_errno()
    why = f"Linux refused this process AMX tile data: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) " \
          f"failed with {errno.errorcode.get(code, code)} ({os.strerror(code)})"
    if code == errno.ENOSPC:
        why += "; a thread's alternate signal stack (sigaltstack) is too small for the tile state: enlarge it"
    return why


def _why_not(path: Path_, flags: frozenset[str]) -> str | None:
    """Why a CPU with `flags` cannot run `path` in this process (its missing flags, or Linux's refusal), or None."""
    missing = [flag for flag in path.cpu_flags if flag not in flags]
    if missing:
        return f"this CPU lacks {', '.join(missing)} (/proc/cpuinfo flags)"
    return tile_data_refusal() if path.tile_data else None


def available_paths(flags: frozenset[str] | None = None) -> tuple[str, ...]:
    """The paths a CPU with `flags` (default: this one's) can run in this process, best first (scalar always)."""
    flags = cpu_flags() if flags is None else flags
    return tuple(path.name for path in PATHS if not _why_not(path, flags))


def chosen_path(requested: str | None = None, flags: frozenset[str] | None = None) -> str:
    """`requested`, else `POWER_CPU_PATH` when set, else the best path of a CPU with `flags` (default: this one's).

    A path the CPU lacks (or, for amx, that Linux does not grant), or an unknown name, is refused
    (CPUPathError), never replaced by another.
    """
    flags = cpu_flags() if flags is None else flags
    requested = requested or os.environ.get(ENV_PATH, "").strip()
    available = available_paths(flags)
    if not requested:
        return available[0]
    if requested not in PATH_NAMES:
        raise CPUPathError(f"CPU path {requested!r} ({ENV_PATH}) is not an instruction path; "
                           f"choose one of {', '.join(PATH_NAMES)}")
    if requested not in available:
        raise CPUPathError(f"CPU path {requested} ({ENV_PATH}): {_why_not(_path(requested), flags)}; "
                           f"it can run {', '.join(available)}; unset {ENV_PATH} to use {available[0]}")
    return requested


def _path(name: str) -> Path_:
    return next(path for path in PATHS if path.name == name)


def build_key(name: str) -> str:
    """A hash of the sources, the path's flags, the torch version and the cache's record schema: a new key builds
    afresh."""
    digest = hashlib.sha256()
    for source in SOURCES:
        digest.update((CSRC / source).read_bytes())
    digest.update(" ".join(COMMON_CFLAGS + _path(name).cflags).encode())
    digest.update(torch.__version__.encode())
    digest.update(cache.RECORD_SCHEMA.encode())
    return digest.hexdigest()[:16]


def namespace_of(name: str) -> str:
    return f"power_cpu_{name}"


def build(name: str, *, force: bool = False, verbose: bool = False) -> None:
    """Compile path `name` into the kernel cache unless it is there (`force`: again, replacing it), on any x86-64
    CPU (the compiler needs only the path's -m flags; whether this CPU runs the path matters when it is loaded).
    `verbose`: the compiler's commands and messages on stdout."""
    if name not in PATH_NAMES:
        raise CPUPathError(f"CPU path {name!r} is not an instruction path; choose one of {', '.join(PATH_NAMES)}")
    key, namespace = build_key(name), namespace_of(name)
    cache.build(name, key, namespace, lambda folder: _compile(name, key, namespace, folder, verbose), force=force)


@functools.cache
def extension(name: str) -> Any:
    """The ops of path `name`, `torch.ops.power_cpu_<name>`: loaded from the kernel cache once checked
    (`power.kernels.cpu.cache`), built first when the cache lacks them (the caller checked the CPU)."""
    key, namespace = build_key(name), namespace_of(name)
    cache.ensure_root()
    if cache.built(name, key) is None:
        build(name)
    cache.load(name, key, namespace, torch.ops.load_library)
    _register_shapes(namespace)
    ops = getattr(torch.ops, namespace)
    _set_wait(ops, kernel_wait())
    return ops


def set_wait(name: str, wait: KernelWait) -> None:
    """From now on path `name`'s idle kernel threads wait as `wait` says (loading takes `kernel_wait()`);
    a benchmark compares waits in one process with it."""
    _set_wait(extension(name), wait)


def _set_wait(ops: Any, wait: KernelWait) -> None:
    ops.set_wait(KERNEL_WAITS.index(wait.mode), KERNEL_SPIN_US)


def _compile(name: str, key: str, namespace: str, folder: Path, verbose: bool) -> None:
    """The library `<namespace>_<key>.so` compiled into `folder` by torch's extension builder, not loaded.

    `cpp_extension.load` would also load it, which a path this CPU lacks cannot survive (its static initialisers
    run the path's instructions) and which registers its ops; its build step alone is
    `_write_ninja_file_and_build_library` (torch is pinned in pyproject.toml; the all-paths build test runs it).
    """
    from torch.utils import cpp_extension

    try:
        with _ninja_on_path():
            cpp_extension._write_ninja_file_and_build_library(
                name=f"{namespace}_{key}", sources=[str(CSRC / source) for source in COMPILED],
                extra_cflags=[*COMMON_CFLAGS, *_path(name).cflags, f"-DPOWER_OPS={namespace}"], extra_cuda_cflags=[],
                extra_sycl_cflags=[], extra_ldflags=["-fopenmp"], extra_include_paths=[], build_directory=str(folder),
                verbose=verbose, with_cuda=False, with_sycl=False)
    except (OSError, RuntimeError, subprocess.CalledProcessError) as error:
        raise cache.KernelBuildError(
            f"building the {name} CPU kernels failed: {error}",
            hint="they need a C++20 compiler with OpenMP (g++ or clang++) and ninja (the `ninja` package Power "
                 "depends on, or one on the PATH); or run `power kernels build` where they are and copy the kernel "
                 "cache (docs/kernels.md)") from error


@contextlib.contextmanager
def _ninja_on_path() -> Iterator[None]:
    """PATH with the `ninja` package's binary folder last, while torch's builder looks for `ninja` there: a Power
    installed into an environment that is not activated still finds the ninja it installed."""
    saved = os.environ.get("PATH", "")
    try:
        import ninja
    except ImportError:
        yield
        return
    os.environ["PATH"] = os.pathsep.join(filter(None, (saved, ninja.BIN_DIR)))
    try:
        yield
    finally:
        os.environ["PATH"] = saved


def _register_shapes(namespace: str) -> None:
    """Output shapes without running the kernels, so that `torch.compile` can trace through a product."""

    @torch.library.register_fake(f"{namespace}::matmul")
    def _matmul(kind: int, packed: torch.Tensor, in_features: int, x: torch.Tensor,  # noqa: ARG001
                tiles: torch.Tensor) -> torch.Tensor:
        return x.new_empty((x.shape[0], tiles.shape[0] * 16))

    @torch.library.register_fake(f"{namespace}::rows")
    def _rows(kind: int, packed: torch.Tensor, in_features: int, rows: torch.Tensor,  # noqa: ARG001
              lane_bytes: torch.Tensor) -> torch.Tensor:  # noqa: ARG001
        return packed.new_empty((rows.shape[0], in_features), dtype=torch.float32)
