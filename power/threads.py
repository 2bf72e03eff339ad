"""How many CPU threads the runtime uses, and how they wait: sized to what this process may run on, yielding
the CPU when idle.

Wait policy. The CPU kernels run on torch's OpenMP threads (libgomp). By default libgomp's idle threads spin
for about 300,000 iterations before they sleep (GOMP_SPINCOUNT, gcc's libgomp/env.c), so on a host whose cores
other work also wants, every wait between two products burns a core the busy threads need. OpenMP reads
its wait policy once, when the runtime loads (with torch), so `settle_wait_policy()` runs when `power` is
imported, before torch: unless the user set OMP_WAIT_POLICY or GOMP_SPINCOUNT, it sets OMP_WAIT_POLICY=passive
(idle threads sleep at once), which measured best of the spins tried on a shared host (docs/runtime.md, "On a
shared host"; bench/bench_wait_policy.py).

The kernel threads' own wait (Power's CPU kernels run on threads of their own): power.kernels.cpu.waits.

Threads. `thread_budget()`: the CPUs in this process's affinity mask (`sched_getaffinity`), capped by the
cgroup's CPU quota rounded up (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`, the smallest
along the cgroup's ancestors), so a pod limited to 2 CPUs on a 64-core node uses 2 threads.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
SPINCOUNT_ENV = "GOMP_SPINCOUNT"
PASSIVE = "passive"
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class WaitPolicy:
    """How OpenMP's idle threads wait in this process, and who decided it."""

    setting: str  # e.g. "OMP_WAIT_POLICY=passive"
    source: str  # "Power" | "environment" | "torch loaded first"

    def describe(self) -> str:
        if self.source == "Power":
            return f"{self.setting} (set by Power: torch's idle OpenMP threads sleep)"
        if self.source == "environment":
            return f"{self.setting} (from the environment)"
        return "libgomp's default spin (torch was loaded before Power could set a wait policy)"


_settled: WaitPolicy | None = None


def settle_wait_policy() -> WaitPolicy:
    """Set the passive wait policy unless the user chose one; a no-op (reported) once torch is loaded."""
    global _settled
    if _settled is None:
        chosen = [f"{name}={os.environ[name]}" for name in (WAIT_POLICY_ENV, SPINCOUNT_ENV) if name in os.environ]
        if chosen:
            _settled = WaitPolicy(" ".join(chosen), "environment")
        elif "torch" in sys.modules:
            _settled = WaitPolicy("default", "torch loaded first")
        else:
            os.environ[WAIT_POLICY_ENV] = PASSIVE
            _settled = WaitPolicy(f"{WAIT_POLICY_ENV}={PASSIVE}", "Power")
    return _settled


def environment_for_other_programs() -> dict[str, str]:
    """This process's environment without the wait policy Power set for itself: another engine Power starts
    (llama-server, vLLM, whose CPU backends may use OpenMP too) keeps its own default."""
    environment = dict(os.environ)
    if _settled is not None and _settled.source == "Power":
        environment.pop(WAIT_POLICY_ENV, None)
    return environment


@dataclass(frozen=True)
class ThreadBudget:
    """The threads to run and why: the affinity's CPUs and the cgroup quota, when there is one."""

    threads: int
    affinity_cpus: int
    quota_cpus: float | None
    quota_file: str | None

    def describe(self) -> str:
        why = f"{self.affinity_cpus} CPUs in this process's affinity"
        if self.quota_cpus is not None:
            why += f", a cgroup quota of {self.quota_cpus:g} CPUs ({self.quota_file})"
        return why


def thread_budget(cgroup_root: Path = CGROUP_ROOT) -> ThreadBudget:
    affinity = len(os.sched_getaffinity(0))
    quota, where = cgroup_quota(cgroup_root)
    threads = affinity if quota is None else max(1, min(affinity, math.ceil(quota)))
    return ThreadBudget(threads, affinity, quota, where)


def cgroup_quota(cgroup_root: Path = CGROUP_ROOT, membership: str | None = None) -> tuple[float | None, str | None]:
    """The smallest CPU quota (in CPUs) over this process's cgroup and its ancestors, and the file that set it;
    (None, None) when there is none. `membership`: /proc/self/cgroup's text (read when None)."""
    if membership is None:
        try:
            membership = Path("/proc/self/cgroup").read_text(encoding="utf-8")
        except OSError:
            return None, None
    limits = [*_v2_limits(cgroup_root, membership), *_v1_limits(cgroup_root, membership)]
    return min(limits, default=(None, None), key=lambda limit: limit[0] if limit[0] is not None else math.inf)


def _v2_limits(cgroup_root: Path, membership: str) -> list[tuple[float, str]]:
    """cgroup v2: `cpu.max` is "QUOTA PERIOD" or "max PERIOD", in each folder from the process's to the root."""
    limits = []
    for line in membership.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy != "0" or controllers:
            continue
        for mount in (cgroup_root, cgroup_root / "unified"):
            for folder in _ancestors(mount, path):
                text = _read(folder / "cpu.max")
                if text is None:
                    continue
                quota, _, period = text.partition(" ")
                if quota != "max" and _positive(quota) and _positive(period):
                    limits.append((int(quota) / int(period), str(folder / "cpu.max")))
    return limits


def _v1_limits(cgroup_root: Path, membership: str) -> list[tuple[float, str]]:
    """cgroup v1: `cpu.cfs_quota_us` (-1: none) over `cpu.cfs_period_us`, in the cpu controller's hierarchy."""
    limits = []
    for line in membership.splitlines():
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "cpu" not in controllers.split(","):
            continue
        for mount in {cgroup_root / "cpu", cgroup_root / controllers, cgroup_root / "cpu,cpuacct"}:
            for folder in _ancestors(mount, path):
                quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
                if quota is not None and period is not None and _positive(quota) and _positive(period):
                    limits.append((int(quota) / int(period), str(folder / "cpu.cfs_quota_us")))
    return limits


def _ancestors(mount: Path, path: str) -> list[Path]:
    """The folders from the cgroup's own to the mount's root (inside a container the mount is the cgroup itself,
    so its own path is not under the mount: then only the root is read)."""
    parts = [part for part in path.split("/") if part and part not in (".", "..")]
    return [mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return None


def _positive(text: str) -> bool:
    return text.isdigit() and int(text) > 0
