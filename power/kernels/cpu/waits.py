"""How the CPU kernels' idle threads wait, and who chose it.

Power's CPU kernels (csrc/pool.cpp) run on threads of their own, not on OpenMP's: a decode step of a small model
makes some eighty products, each too short to pay for waking a sleeping thread, and a thread that spins between
them takes the CPU a contended host's other work needs. `kernel_wait()`: by default (adaptive) an idle kernel
thread spins for up to KERNEL_SPIN_US while the host is quiet and sleeps at once while it is contended, judged from
the calling thread's run-queue delay over the last 20 ms (/proc/thread-self/schedstat); POWER_KERNEL_WAIT=sleep or
=spin fixes either (docs/runtime.md, "How kernel threads wait"). Like POWER_KERNEL_CACHE, the variable is this
layer's own: every process that loads the kernels honours it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from power.kernels.cpu.cache import KernelError

KERNEL_WAIT_ENV = "POWER_KERNEL_WAIT"
KERNEL_WAITS = ("sleep", "spin", "adaptive")  # in the order of pool.h's `Wait`
KERNEL_SPIN_US = 200


class KernelWaitError(KernelError):
    """POWER_KERNEL_WAIT names no wait."""

    code = "PWR652"


@dataclass(frozen=True)
class KernelWait:
    """How Power's kernel threads wait when idle, and who decided it."""

    mode: str  # one of KERNEL_WAITS
    source: str  # "Power" | "environment"

    def describe(self) -> str:
        how = {"sleep": "sleep at once",
               "spin": f"spin up to {KERNEL_SPIN_US} us, then sleep",
               "adaptive": f"spin up to {KERNEL_SPIN_US} us while the host is quiet, sleep at once while it is "
                           "contended"}[self.mode]
        who = "set by Power" if self.source == "Power" else f"{KERNEL_WAIT_ENV} from the environment"
        return f"{self.mode}: idle kernel threads {how} ({who})"


def kernel_wait() -> KernelWait:
    """The kernel threads' wait: POWER_KERNEL_WAIT when set (refused when it names no wait), else adaptive."""
    chosen = os.environ.get(KERNEL_WAIT_ENV)
    if chosen is None:
        return KernelWait("adaptive", "Power")
    if chosen not in KERNEL_WAITS:
        raise KernelWaitError(f"{KERNEL_WAIT_ENV}={chosen!r} is not a wait for Power's kernel threads",
                              hint=f"set it to one of {', '.join(KERNEL_WAITS)}, or unset it for Power's adaptive "
                                   "wait (docs/runtime.md, \"How kernel threads wait\")")
    return KernelWait(chosen, "environment")
