"""How much memory this process can still get on this host, and whether what the runtime holds fits in it.

What the process can still get is the least of: the kernel's estimate of memory
available without swapping (`MemAvailable`, /proc/meminfo), the room left under
its cgroup's limit (`memory.max` - `memory.current`, cgroup v2) and under its
address-space limit (`ulimit -v`: RLIMIT_AS - VmSize). A limit that cannot be read
is not a limit.

Torch-free, so `power plan` judges the host it runs on with the figures the runtime
refuses on at load (PWR520, `power.runtime.host_memory`).
"""

from __future__ import annotations

import resource
from dataclasses import dataclass, field
from pathlib import Path

MEMINFO = Path("/proc/meminfo")
STATUS = Path("/proc/self/status")
CGROUP = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Room:
    """`needed` bytes against what this process can still get under each limit that says."""

    needed: int
    limits: dict[str, int] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return not self.limits or self.needed <= min(self.limits.values())

    def figures(self) -> str:
        """What this process can get, limit by limit ("nothing limits" where no limit can be read)."""
        if not self.limits:
            return "nothing this process can read limits its memory"
        parts = ", ".join(f"{name} {mib(value)}" for name, value in self.limits.items())
        return f"this process can get {mib(min(self.limits.values()))} ({parts})"


def room_for(needed: int) -> Room:
    """`needed` bytes against this host's limits, read now."""
    return Room(needed, _limits())


def mib(n_bytes: int) -> str:
    return f"{n_bytes / 2**20:,.1f} MiB"


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
