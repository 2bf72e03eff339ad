"""Whether the host was quiet while `power bench` measured: load average and the other processes' CPU share.

Speed ratios mean little on a machine something else is loading. Before and
after each configuration's turn (side by side: before and after the whole run)
the bench samples the load average and, over a short window, the share of the
machine's CPU time spent by processes other than the bench and the servers it
started (`/proc/stat` against `/proc/PID/stat`), and, where `nvidia-smi` exists,
the GPU's compute processes that are not the bench's. A sample over the limits
below marks the run busy, and every shape's verdict says so (docs/bench.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

WINDOW_S = 0.5
# Busy: other processes took more than this share of the machine's CPU time, or the 1-minute load average exceeds
# the cores (runnable work was queueing for them).
BUSY_SHARE = 0.25


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies over every CPU since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values) - idle, sum(values)


def _process_jiffies(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0
    return int(fields[11]) + int(fields[12])  # utime + stime


def _gpu_tenants(ours: set[int]) -> list[dict[str, Any]] | None:
    """The GPU's compute processes that are not ours (None: no nvidia-smi here)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        listed = subprocess.run([smi, "--query-compute-apps=pid,process_name,used_memory",
                                 "--format=csv,noheader,nounits"],
                                capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    tenants = []
    for line in listed.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit() and int(parts[0]) not in ours:
            tenants.append({"pid": int(parts[0]), "name": parts[1], "used_mib": parts[2]})
    return tenants


def sample(ours: set[int], window_s: float = WINDOW_S) -> dict[str, Any]:
    """Load average, and the share of all CPU time over `window_s` that processes not in `ours` spent."""
    busy_before, total_before = _cpu_jiffies()
    own_before = sum(_process_jiffies(pid) for pid in ours)
    time.sleep(window_s)
    busy_after, total_after = _cpu_jiffies()
    own_after = sum(_process_jiffies(pid) for pid in ours)
    total = max(1, total_after - total_before)
    others = max(0, (busy_after - busy_before) - (own_after - own_before))
    result: dict[str, Any] = {"load_avg": [round(v, 2) for v in os.getloadavg()],
                              "other_cpu_share": round(others / total, 3)}
    tenants = _gpu_tenants(ours)
    if tenants is not None:
        result["gpu_other_processes"] = tenants
    return result


@dataclass
class HostWatch:
    """The samples of one bench run; `ours` names the processes whose CPU time is the bench's own."""

    ours: Callable[[], set[int]]
    samples: list[dict[str, Any]] = field(default_factory=list)

    def observe(self, what: str, when: str) -> None:
        """`what`: a configuration's label (or "all"); `when`: before | after."""
        self.samples.append({"what": what, "when": when, **sample({os.getpid(), *self.ours()})})

    def busy(self) -> str | None:
        """Why the host was busy (None: quiet in every sample)."""
        cores = os.cpu_count() or 1
        reasons = []
        for s in self.samples:
            if s["other_cpu_share"] > BUSY_SHARE:
                reasons.append(f"{s['when']} {s['what']}: other processes took {s['other_cpu_share']:.0%} of the CPU")
            elif s["load_avg"][0] > cores:
                reasons.append(f"{s['when']} {s['what']}: load average {s['load_avg'][0]:.2f} over {cores} cores")
            elif s.get("gpu_other_processes"):
                reasons.append(f"{s['when']} {s['what']}: {len(s['gpu_other_processes'])} other process(es) on the GPU")
        return "; ".join(reasons) or None

    def document(self) -> dict[str, Any]:
        reason = self.busy()
        return {"busy": reason is not None, "reason": reason or "quiet in every sample", "busy_share": BUSY_SHARE,
                "cores": os.cpu_count(), "samples": self.samples}
