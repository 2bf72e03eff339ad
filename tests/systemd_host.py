"""A real systemd for tests of what Power does to a deployment's systemd unit: Debian's systemd (scripts/bootstrap
installs it) booted as PID 1 of its own PID, mount, UTS and IPC namespaces, under a cgroup of its own.

Inside, /tmp, /run and /var/tmp are private tmpfs mounts, so nothing systemd does there reaches the machine's own
(its units live in /run/systemd/system, a transient `systemd-run` unit would be gone after a stop); the folders a test
shares (its temporary folder, and the checkout whose model and virtual environment the units run, which may itself
lie under /tmp) are bound back in at the same paths, so plans, logs and evidence are shared. It boots a target of its
own (`power-test.target`) that pulls in nothing. The network is the machine's, so a unit's server answers on
127.0.0.1 on both sides. `booted()` waits until `systemctl is-system-running` answers `running`, and kills the
namespace's PID 1 (and with it every process inside) on every exit path. A machine that cannot boot it fails the
test: CI runs as root, where it must work.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

BOOT_TIMEOUT_S = 60.0
HYBRID_ROOTS = (Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup/unified"))  # systemd's v1 tracking + cgroup2
UNIFIED_ROOT = Path("/sys/fs/cgroup")  # a cgroup2-only machine

# $1: how many cgroup.procs files follow, which this shell joins before it leaves the machine's namespaces; then the
# folders to share. Inside, each folder is bound under a private /mnt first, and back at its own path once /tmp, /run
# and /var/tmp are masked (a folder under /tmp would be hidden otherwise).
_BOOT = r"""
set -e
for needed in /lib/systemd/systemd /usr/bin/unshare /usr/bin/nsenter; do
  [ -x "$needed" ] || { echo "no $needed: install Debian's systemd and util-linux (scripts/bootstrap)"; exit 1; }
done
joins=$1
shift
while [ "$joins" -gt 0 ]; do echo $$ > "$1"; shift; joins=$((joins - 1)); done
exec unshare --pid --fork --mount --uts --ipc --mount-proc --propagation private sh -c '
set -e
mount -t tmpfs tmpfs /mnt
i=0
for folder in "$@"; do mkdir /mnt/$i; mount --bind "$folder" /mnt/$i; i=$((i + 1)); done
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /var/tmp
i=0
for folder in "$@"; do mkdir -p "$folder"; mount --no-canonicalize --bind /mnt/$i "$folder"; i=$((i + 1)); done
mkdir -p /run/systemd/system
printf "[Unit]\nDescription=Power test host\n" > /run/systemd/system/power-test.target
cd /
exec /lib/systemd/systemd --unit=power-test.target </dev/null >/dev/null 2>&1
' sh "$@"
"""


class SystemdHost:
    """The booted systemd: commands run inside its namespaces with nsenter."""

    def __init__(self, pid: int) -> None:
        self.pid = pid  # its PID 1, as the machine numbers it

    def command(self, *words: str, cwd: Path | None = None) -> list[str]:
        return ["nsenter", "--target", str(self.pid), "--all", f"--wd={cwd or '/'}", "--", *words]

    def run(self, *words: str) -> str:
        done = subprocess.run(self.command(*words), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{' '.join(words)}: {done.stderr}"
        return done.stdout

    def systemctl(self, *words: str) -> str:
        return self.run("systemctl", *words)

    def show(self, unit: str) -> dict[str, str]:
        answer = self.systemctl("show", "-p", "ActiveState,MainPID,NRestarts,ControlGroup", unit)
        return dict(line.split("=", 1) for line in answer.splitlines())

    def install(self, unit: str, text: str) -> None:
        """A unit file under /run/systemd/system, then `daemon-reload`."""
        self.run("sh", "-c", 'cat > "/run/systemd/system/$0" <<"EOF"\n' + text + "EOF\n", unit)
        self.systemctl("daemon-reload")

    def processes(self, name: str) -> list[int]:
        """The processes called `name` inside, as the machine numbers them."""
        inside = os.readlink(f"/proc/{self.pid}/ns/pid")
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if (entry.name.isdigit() and os.readlink(entry / "ns" / "pid") == inside
                        and (entry / "comm").read_text().strip() == name
                        and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"):
                    found.append(int(entry.name))
            except OSError:
                continue
        return found


@contextmanager
def booted(*shared: Path) -> Iterator[SystemdHost]:
    """systemd booted, each `shared` folder visible inside at the same path (the first holds its log); torn down with
    everything inside on exit."""
    name = f"power-test-{os.getpid()}-{time.monotonic_ns()}"
    cgroups = _cgroups(name)
    log = shared[0] / f"{name}.log"
    joins = [str(c / "cgroup.procs") for c in cgroups]
    folders = [str(folder.resolve()) for folder in shared]
    with open(log, "wb") as output:
        outer = subprocess.Popen(["sh", "-c", _BOOT, "sh", str(len(joins)), *joins, *folders],
                                 stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    try:
        host = SystemdHost(_init_of(outer, log))
        _wait_running(host, outer, log)
        yield host
    finally:
        for init in _children(outer.pid):
            os.kill(init, signal.SIGKILL)  # the kernel kills every process of the namespace with it
        outer.kill()
        outer.wait(timeout=60)
        _remove(cgroups)


def _cgroups(name: str) -> list[Path]:
    """A cgroup `name` in each hierarchy systemd uses, so the systemd inside keeps its units under it (systemd as PID
    1 takes its own cgroup for the root) and never touches the machine's own."""
    hybrid = [root for root in HYBRID_ROOTS if (root / "cgroup.procs").is_file()]
    roots = hybrid or [root for root in (UNIFIED_ROOT,) if (root / "cgroup.procs").is_file()]
    if not roots:
        pytest.fail("no cgroup hierarchy under /sys/fs/cgroup: systemd cannot boot for this test")
    for root in roots:
        (root / name).mkdir()
    return [root / name for root in roots]


def _init_of(outer: subprocess.Popen, log: Path) -> int:
    """The namespace's PID 1 once it has become systemd: the child `unshare --fork` (`outer`, once its shell has
    exec'd it) made."""
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while time.monotonic() < deadline:
        if outer.poll() is not None:
            pytest.fail(f"systemd could not boot in its own namespaces (status {outer.returncode}): "
                        f"{log.read_text()[-2000:]}")
        children = _children(outer.pid)
        if children and _comm(children[0]) == "systemd":
            return children[0]
        time.sleep(0.1)
    pytest.fail(f"systemd did not start within {BOOT_TIMEOUT_S:.0f} s: {log.read_text()[-2000:]}")


def _children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _wait_running(host: SystemdHost, outer: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    state = ""
    while state != "running":
        if outer.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"systemd did not reach `running` (last answer {state!r}): {log.read_text()[-2000:]}")
        time.sleep(0.2)
        state = subprocess.run(host.command("systemctl", "is-system-running"), capture_output=True,
                               text=True).stdout.strip()


def _remove(cgroups: list[Path]) -> None:
    """The cgroups systemd made under ours, innermost first, once the killed processes have left them."""
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    for top in cgroups:
        for folder in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [top]:
            while True:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)


def entered(nsenter: subprocess.Popen) -> int:
    """The command an `nsenter` started inside (its forked child), as the machine numbers it."""
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while not (children := _children(nsenter.pid)):
        assert nsenter.poll() is None and time.monotonic() < deadline, "the command inside never started"
        time.sleep(0.1)
    return children[0]
