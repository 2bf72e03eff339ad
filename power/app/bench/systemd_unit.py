"""The systemd service a process runs in, and what `systemctl` says and does about it (`power bench
--deployment-port`, `power.app.bench.standing`).

The unit is read from the process's own cgroup (`/proc/PID/cgroup`: systemd puts
every process of a service in the service's cgroup, systemd.unit(5)), then
confirmed with `systemctl show`: the unit must be loaded and its `ControlGroup`
must be the one the process is in, so the systemd that answers is the one that
supervises the server.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from power.findings import PowerError

SYSTEMCTL_TIMEOUT_S = 600.0
PROPERTIES = ("LoadState", "ActiveState", "MainPID", "NRestarts", "ControlGroup", "FragmentPath")


class UnitError(PowerError):
    """systemctl cannot confirm, stop or start the deployment's unit; the message says what and the fix."""

    code = "PWR477"


def cgroup_of(pid: int) -> str | None:
    """The cgroup systemd tracks `pid` in: its own v1 hierarchy (`name=systemd`) where mounted, else the unified one."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    paths = {hierarchy: path for _, hierarchy, path in (line.split(":", 2) for line in lines if line.count(":") >= 2)}
    return paths.get("name=systemd") or paths.get("")


def service_in(cgroup: str | None) -> str | None:
    """The service a cgroup is (`/system.slice/llama.service` -> `llama.service`); None for a scope or a slice, as a
    login session's processes are in (a process under `user@1000.service/app.slice/...scope` is no service's)."""
    last = (cgroup or "").rsplit("/", 1)[-1]
    return last if last.endswith(".service") else None


def show(unit: str) -> dict[str, str]:
    """`systemctl show` of the properties Power reads (PROPERTIES)."""
    answer = _systemctl("show", "-p", ",".join(PROPERTIES), unit)
    return dict(line.split("=", 1) for line in answer.splitlines() if "=" in line)


def stop(unit: str) -> None:
    _systemctl("stop", unit)


def start(unit: str) -> None:
    _systemctl("start", unit)


def status_hint(unit: str) -> str:
    """Where an operator reads why a unit did not do what it was told."""
    return f"see `systemctl status {unit}` and `journalctl -u {unit}`"


def _systemctl(*words: str) -> str:
    command = " ".join(("systemctl", *words))
    try:
        done = subprocess.run(["systemctl", *words], capture_output=True, text=True, timeout=SYSTEMCTL_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise UnitError(f"`{command}`: systemctl is not on PATH", hint="run the bench on the host whose systemd runs "
                        "the deployment's unit") from None
    except subprocess.TimeoutExpired:
        raise UnitError(f"`{command}` did not finish in {SYSTEMCTL_TIMEOUT_S:.0f} s",
                        hint=status_hint(words[-1])) from None
    if done.returncode != 0:
        raise UnitError(f"`{command}` failed (status {done.returncode}): {done.stderr.strip()}",
                        hint=status_hint(words[-1]))
    return done.stdout
