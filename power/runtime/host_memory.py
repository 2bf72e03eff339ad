"""Whether this host can hold what the runtime is about to load: asked before a byte of tensor data is read.

The runtime on the CPU keeps every artifact's tensors in host memory, each in its
resident layout (GGUF blocks in the kernels' tiles, or dequantised to float32),
never less than the tensor bytes the headers declare. When those bytes exceed
what this process can still get, loading would end in the kernel's OOM killer
minutes later with no message; it is refused first (PWR520) with both figures.

What the process can still get is the least of: the kernel's estimate of memory
available without swapping (`MemAvailable`, /proc/meminfo), the room left under
its cgroup's limit (`memory.max` - `memory.current`, cgroup v2) and under its
address-space limit (`ulimit -v`: RLIMIT_AS - VmSize). A limit that cannot be read
is not a limit.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Sequence

from power.artifacts.gguf_reader import open_regular_file, read_open_header
from power.artifacts.verify import Artifact, present
from power.runtime.errors import RuntimeInputError
from power.runtime.gguf_weights import require_tensor_data

MEMINFO = Path("/proc/meminfo")
STATUS = Path("/proc/self/status")
CGROUP = Path("/sys/fs/cgroup")


def require_room(artifacts: Sequence[Artifact]) -> None:
    """Refuse an artifact without tensor data (PWR650), then (PWR520) artifacts whose tensor bytes exceed the memory
    this process can still get."""
    for artifact in artifacts:
        present(artifact)
    tensors = {artifact.path: _tensor_bytes(artifact.path) for artifact in artifacts}
    needed = sum(tensors.values())
    room = available_bytes()
    if room is None or needed <= room:
        return
    parts = ", ".join(f"{path.name} {_mib(size)}" for path, size in tensors.items())
    raise RuntimeInputError(
        f"the runtime would hold at least {_mib(needed)} of weights in host memory ({parts}), and this process "
        f"can get {_mib(room)} ({', '.join(f'{name} {_mib(value)}' for name, value in _limits().items())})",
        code="PWR520", file=str(artifacts[0].path),
        hint="run on a host with more free memory or a GPU (--device cuda), or plan a smaller quantisation of the model")


def _tensor_bytes(path: Path) -> int:
    fd, opened = open_regular_file(path)
    try:
        header = read_open_header(fd, opened.st_size, str(path))
        require_tensor_data(fd, header)
    finally:
        os.close(fd)
    return sum(t.nbytes for t in header.tensors)


def _mib(n_bytes: int) -> str:
    return f"{n_bytes / 2**20:,.1f} MiB"


def available_bytes() -> int | None:
    """The memory this process can still get (None: nothing says)."""
    limits = _limits()
    return min(limits.values()) if limits else None


def _limits() -> dict[str, int]:
    limits = {}
    meminfo = _fields(MEMINFO)
    if "MemAvailable" in meminfo:
        limits["MemAvailable"] = meminfo["MemAvailable"]
    cgroup = _cgroup_room()
    if cgroup is not None:
        limits["cgroup memory.max room"] = cgroup
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    mapped = _fields(STATUS).get("VmSize")
    if soft != resource.RLIM_INFINITY and mapped is not None:
        limits["ulimit -v room"] = max(0, soft - mapped)
    return limits


def _fields(path: Path) -> dict[str, int]:
    """`Key: N kB` lines as bytes."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    fields = {}
    for line in lines:
        key, _, value = line.partition(":")
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            fields[key] = int(parts[0]) * 1024
    return fields


def _cgroup_room() -> int | None:
    try:
        relative = next(line.split("::", 1)[1] for line in Path("/proc/self/cgroup").read_text().splitlines()
                        if line.startswith("0::"))
        folder = CGROUP / relative.strip().lstrip("/")
        limit = (folder / "memory.max").read_text().strip()
        current = int((folder / "memory.current").read_text())
    except (OSError, StopIteration, ValueError):
        return None
    return None if limit == "max" or not limit.isdigit() else max(0, int(limit) - current)
