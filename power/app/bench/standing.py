"""The deployment's own engine, stopped while `power bench` measures on its device and restored exactly afterwards.

A card that holds the deployment's server cannot also hold the configurations
being measured, so the bench stops the server listening on the deployment's
port (`--deployment-port`), as an operator would stop it by hand, and restores
it when the bench ends. Callers register `restore` on an ExitStack, so the
server comes back on every exit path (a finished run, a failure, Ctrl-C), and
`restore` waits until the port answers `/health` again. Every stop and start is
an event in the bench's lifecycle record (`power.app.bench.lifecycle`).
`stand_down` is the bench's one step: find, register the restore, stop.

How it is stopped and restored follows who runs it:
- a systemd service (the listener's cgroup is a `*.service`, confirmed with
  `systemctl show`): `systemctl stop` and `systemctl start`, so systemd keeps
  supervising it (`UnitStanding`);
- a plain process: SIGTERM, then started again the same way, its command line,
  working folder and environment read from `/proc` before it was stopped, its
  output appended to the file it wrote to (`Standing`);
- a process in another PID namespace (a container, a Kubernetes pod) is refused
  before anything stops: Power cannot start it again as its owner would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click

from power.app.bench import systemd_unit
from power.app.bench.lifecycle import Lifecycle
from power.app.cli import refuse
from power.findings import PowerError

LOOPBACK = "127.0.0.1"
STOP_TIMEOUT_S = 60.0
RESTORE_TIMEOUT_S = 600.0
_LISTEN = "0A"  # /proc/net/tcp's state for a listening socket
SERVING_STATES = ("active", "activating", "reloading")  # a unit systemd runs (or is starting) on purpose


class StandingError(PowerError):
    """The deployment's server cannot be read, stopped or restored; the message says what and the fix."""

    code = "PWR473"


@dataclass(frozen=True)
class StandingServer:
    """How the process serving the deployment's port was started, as `/proc` shows it."""

    port: int
    pid: int
    argv: list[str]
    cwd: str
    env: dict[str, str]
    output: str | None  # the regular file its stdout went to, else None
    cgroup: str | None
    unit: str | None  # the systemd service its cgroup is, else None


def listening_inodes(port: int) -> set[str]:
    """The socket inodes listening on `port` (IPv4 and IPv6), from /proc/net/tcp{,6}."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def _owner(inodes: set[str]) -> int | None:
    """The process holding one of `inodes` open."""
    targets = {f"socket:[{inode}]" for inode in inodes}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in targets:
                    return int(entry.name)
        except OSError:
            continue
    return None


def find(port: int) -> StandingServer | None:
    """The server listening on `port` (None: the port is free); StandingError when it cannot be read back, or runs
    in another PID namespace."""
    inodes = listening_inodes(port)
    if not inodes:
        return None
    pid = _owner(inodes)
    if pid is None:
        raise StandingError(f"something listens on port {port}, but no process this user can read owns it",
                            hint="stop the deployment's server by hand, or run the bench as the user that runs it")
    proc = Path(f"/proc/{pid}")
    try:
        namespace = os.readlink(proc / "ns" / "pid")
        argv = [word.decode() for word in (proc / "cmdline").read_bytes().split(b"\0") if word]
        env = dict(entry.decode().split("=", 1) for entry in (proc / "environ").read_bytes().split(b"\0")
                   if b"=" in entry)
        cwd = os.readlink(proc / "cwd")
        output = os.readlink(proc / "fd" / "1")
    except OSError as err:
        raise StandingError(f"the server on port {port} (pid {pid}) cannot be read back to restore it: {err}",
                            hint="stop it by hand and start it again after the bench") from None
    cgroup = systemd_unit.cgroup_of(pid)
    if namespace != os.readlink("/proc/self/ns/pid"):
        raise StandingError(f"the server on port {port} (pid {pid}, cgroup {cgroup}) runs in another PID namespace "
                            "(a container or a Kubernetes pod): Power cannot start it again as its owner would",
                            code="PWR476", hint="stop it yourself (a Kubernetes deployment: `kubectl scale deployment "
                            "NAME --replicas=0`; a container: `docker stop NAME`), bench with --one-at-a-time and "
                            "without --deployment-port, then start it again")
    return StandingServer(port, pid, argv, cwd, env, output if Path(output).is_file() else None, cgroup,
                          systemd_unit.service_in(cgroup))


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/health", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _gone(pid: int) -> bool:
    """Exited (a zombie its parent has not reaped yet counts: it holds no port and no memory)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _wait(done: Callable[[], bool], timeout_s: float, failure: Callable[[], StandingError], every_s: float) -> None:
    """Poll `done` until it holds; raise `failure()` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise failure()
        time.sleep(every_s)


def _wait_port_free(port: int, fix: str) -> None:
    """A configuration or the stopped server may still be releasing the port."""
    _wait(lambda: not listening_inodes(port), STOP_TIMEOUT_S,
          lambda: StandingError(f"port {port} is still taken {STOP_TIMEOUT_S:.0f} s later", hint=fix), 0.2)


def _wait_healthy(port: int, alive: Callable[[], bool], fix: str) -> None:
    """Until the port answers /health; fails as soon as `alive` says the server is gone."""
    def answered() -> bool:
        if healthy(port):
            return True
        if not alive():
            raise StandingError(f"the deployment's server exited before it answered /health on port {port}", hint=fix)
        return False

    _wait(answered, RESTORE_TIMEOUT_S, lambda: StandingError(
        f"the deployment's server did not answer /health on port {port} within {RESTORE_TIMEOUT_S:.0f} s",
        hint=fix), 0.5)


def hold(server: StandingServer, lifecycle: Lifecycle) -> Standing | UnitStanding:
    """How `server` is stopped and restored: with systemctl when its systemd unit runs it, else as a process."""
    return Standing(server, lifecycle) if server.unit is None else UnitStanding(server, server.unit, lifecycle)


class _Held(ABC):
    """Stopped for the bench and brought back; `restore` is safe to call more than once."""

    def __init__(self, server: StandingServer, lifecycle: Lifecycle) -> None:
        self.server = server
        self.lifecycle = lifecycle
        self.stopped = False
        self.restored: int | None = None  # the restored server's pid; None while nothing was restored

    def restore(self) -> None:
        """Start the server again and wait until its port answers /health; Ctrl-C is held off while it starts, so a
        second interrupt cannot leave the deployment down."""
        if not self.stopped or self.restored is not None:
            return
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            self._restore()
        finally:
            signal.signal(signal.SIGINT, previous)

    @abstractmethod
    def stop(self) -> None: ...

    @abstractmethod
    def _restore(self) -> None: ...


class Standing(_Held):
    """A plain process: stopped with SIGTERM, started again as it was started."""

    def stop(self) -> None:
        server = self.server
        self.lifecycle.event("stop", "deployment", port=server.port, pid=server.pid)
        try:
            os.kill(server.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        self.stopped = True
        _wait(lambda: _gone(server.pid) and not listening_inodes(server.port), STOP_TIMEOUT_S,
              lambda: StandingError(f"the deployment's server (pid {server.pid}) still holds port {server.port} "
                                    f"{STOP_TIMEOUT_S:.0f} s after SIGTERM", hint="stop it by hand, then rerun"), 0.2)
        self.lifecycle.event("stopped", "deployment", port=server.port, pid=server.pid)

    def _restore(self) -> None:
        server = self.server
        by_hand = f"free the port and start it by hand: {' '.join(server.argv)}"
        _wait_port_free(server.port, by_hand)
        with open(server.output or os.devnull, "ab") as output:
            process = subprocess.Popen(server.argv, cwd=server.cwd, env=server.env, stdin=subprocess.DEVNULL,
                                       stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        self.restored = process.pid
        self.lifecycle.event("start", "deployment", port=server.port, pid=process.pid)
        _wait_healthy(server.port, lambda: process.poll() is None, by_hand)
        self.lifecycle.event("healthy", "deployment", port=server.port, pid=process.pid)


class UnitStanding(_Held):
    """A server its systemd unit runs: stopped and started with systemctl, so systemd supervises it afterwards as
    before (its Restart= policy never sees the stop as a failure)."""

    def __init__(self, server: StandingServer, unit: str, lifecycle: Lifecycle) -> None:
        super().__init__(server, lifecycle)
        self.unit = unit
        self.before = self._confirmed()

    def _confirmed(self) -> dict[str, str]:
        """The unit as systemd shows it; refused unless that systemd runs the server now."""
        server, unit = self.server, self.unit
        state = systemd_unit.show(unit)
        if state.get("LoadState") != "loaded" or state.get("ControlGroup") != server.cgroup:
            raise systemd_unit.UnitError(
                f"the server on port {server.port} (pid {server.pid}) is in cgroup {server.cgroup}, but the systemd "
                f"systemctl reaches here shows {unit} as LoadState={state.get('LoadState')}, ControlGroup="
                f"{state.get('ControlGroup') or '(none)'}", hint="run the bench as root on the host whose systemd "
                f"runs {unit}, or stop it yourself and bench with --one-at-a-time without --deployment-port")
        if state["ActiveState"] not in SERVING_STATES:
            raise StandingError(
                f"the server on port {server.port} (pid {server.pid}) was left behind by {unit}, which systemd no "
                f"longer runs (ActiveState={state['ActiveState']}): Power will not stop or start it for you",
                code="PWR478", hint=f"stop it yourself (`systemctl kill {unit}`), start the deployment as you run it, "
                "then rerun the bench")
        return state

    def _event(self, event: str, state: dict[str, str]) -> None:
        self.lifecycle.event(event, "deployment", port=self.server.port, unit=self.unit, pid=int(state["MainPID"]),
                             active_state=state["ActiveState"], n_restarts=int(state["NRestarts"]))

    def stop(self) -> None:
        self._event("stop", self.before)
        self.stopped = True
        systemd_unit.stop(self.unit)
        _wait_port_free(self.server.port, f"`systemctl stop {self.unit}` left the port taken: free it, then "
                        f"`systemctl start {self.unit}`")
        self._event("stopped", systemd_unit.show(self.unit))

    def _restore(self) -> None:
        unit = self.unit
        if systemd_unit.show(unit)["ActiveState"] in SERVING_STATES:  # the stop never went through: nothing to restore
            return
        _wait_port_free(self.server.port, f"free the port, then `systemctl start {unit}`")
        systemd_unit.start(unit)
        started = systemd_unit.show(unit)
        self.restored = int(started["MainPID"])
        self._event("start", started)
        _wait_healthy(self.server.port, lambda: systemd_unit.show(unit)["ActiveState"] in SERVING_STATES,
                      systemd_unit.status_hint(unit))
        now = systemd_unit.show(unit)
        self.restored = int(now["MainPID"])
        self._event("healthy", now)


def stand_down(port: int, lifecycle: Lifecycle, running: contextlib.ExitStack) -> None:
    """Stop the deployment's server on `port` (if one runs), its restore registered first on `running`."""
    found = find(port)
    if found is None:
        click.echo(f"deployment port {port}: nothing listens there, so nothing is stopped", err=True)
        lifecycle.event("absent", "deployment", port=port)
        return
    held = hold(found, lifecycle)
    how = f"systemd unit {found.unit}, with systemctl" if found.unit else f"pid {found.pid}"
    click.echo(f"stopping the deployment's server on port {port} ({how}); it is restored when the bench ends", err=True)
    running.callback(_restore, held)
    held.stop()


def _restore(held: Standing | UnitStanding) -> None:
    """Bring the deployment back; when it cannot be, say so and exit with the usage code (the bench's figures, if
    any, are not worth a deployment left down)."""
    try:
        held.restore()
    except PowerError as err:
        refuse(err)
    if held.restored is not None:
        unit = f"systemd unit {held.server.unit}, " if held.server.unit else ""
        click.echo(f"restored the deployment's server on port {held.server.port} ({unit}pid {held.restored})", err=True)
