"""The deployment's own engine, stopped while `power bench` measures on its device and restored exactly afterwards.

A card that holds the deployment's server cannot also hold the configurations
being measured, so the bench stops the server listening on the deployment's
port (`--deployment-port`), as an operator would stop the unit by hand, and
starts it again the way it was started: the same command line, working folder
and environment, read from `/proc` before it was stopped, its output appended
to the file it wrote to. Callers register `restore` on an ExitStack, so the
server comes back on every exit path (a finished run, a failure, Ctrl-C), and
`restore` waits until the port answers `/health` again. Every stop and start is
an event in the bench's lifecycle record (`power.app.bench.lifecycle`).
`stand_down` is the bench's one step: find, register the restore, stop.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import click

from power.app.bench.lifecycle import Lifecycle
from power.app.cli import refuse
from power.findings import PowerError

LOOPBACK = "127.0.0.1"
STOP_TIMEOUT_S = 60.0
RESTORE_TIMEOUT_S = 600.0
_LISTEN = "0A"  # /proc/net/tcp's state for a listening socket


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
    """The server listening on `port` (None: the port is free); StandingError when it cannot be read back."""
    inodes = listening_inodes(port)
    if not inodes:
        return None
    pid = _owner(inodes)
    if pid is None:
        raise StandingError(f"something listens on port {port}, but no process this user can read owns it",
                            hint="stop the deployment's server by hand, or run the bench as the user that runs it")
    proc = Path(f"/proc/{pid}")
    try:
        argv = [word.decode() for word in (proc / "cmdline").read_bytes().split(b"\0") if word]
        env = dict(entry.decode().split("=", 1) for entry in (proc / "environ").read_bytes().split(b"\0")
                   if b"=" in entry)
        cwd = os.readlink(proc / "cwd")
        output = os.readlink(proc / "fd" / "1")
    except OSError as err:
        raise StandingError(f"the server on port {port} (pid {pid}) cannot be read back to restore it: {err}",
                            hint="stop it by hand and start it again after the bench") from None
    return StandingServer(port, pid, argv, cwd, env, output if Path(output).is_file() else None)


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


class Standing:
    """Stops the deployment's server for the bench and brings it back; `restore` is safe to call more than once."""

    def __init__(self, server: StandingServer, lifecycle: Lifecycle) -> None:
        self.server = server
        self.lifecycle = lifecycle
        self.stopped = False
        self.restored: int | None = None  # the restored process's pid

    def stop(self) -> None:
        server = self.server
        self.lifecycle.event("stop", "deployment", port=server.port, pid=server.pid)
        try:
            os.kill(server.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        self.stopped = True
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while not (_gone(server.pid) and not listening_inodes(server.port)):
            if time.monotonic() > deadline:
                raise StandingError(f"the deployment's server (pid {server.pid}) still holds port {server.port} "
                                    f"{STOP_TIMEOUT_S:.0f} s after SIGTERM", hint="stop it by hand, then rerun")
            time.sleep(0.2)
        self.lifecycle.event("stopped", "deployment", port=server.port, pid=server.pid)

    def restore(self) -> None:
        """Start the server again as it was started, and wait until its port answers /health; Ctrl-C is held off
        while it starts, so a second interrupt cannot leave the deployment down."""
        if not self.stopped or self.restored is not None:
            return
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            self._restore()
        finally:
            signal.signal(signal.SIGINT, previous)

    def _restore(self) -> None:
        server = self.server
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while listening_inodes(server.port):  # a configuration may still be releasing it
            if time.monotonic() > deadline:
                raise StandingError(f"port {server.port} is still taken: the deployment's server cannot be restored",
                                    hint=f"free the port and start it by hand: {' '.join(server.argv)}")
            time.sleep(0.2)
        with open(server.output or os.devnull, "ab") as output:
            process = subprocess.Popen(server.argv, cwd=server.cwd, env=server.env, stdin=subprocess.DEVNULL,
                                       stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        self.restored = process.pid
        self.lifecycle.event("start", "deployment", port=server.port, pid=process.pid)
        deadline = time.monotonic() + RESTORE_TIMEOUT_S
        while not healthy(server.port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise StandingError(f"the deployment's server did not come back healthy on port {server.port} "
                                    f"(status {process.poll()})", hint=f"start it by hand: {' '.join(server.argv)}")
            time.sleep(0.5)
        self.lifecycle.event("healthy", "deployment", port=server.port, pid=process.pid)


def stand_down(port: int, lifecycle: Lifecycle, running: contextlib.ExitStack) -> None:
    """Stop the deployment's server on `port` (if one runs), its restore registered first on `running`."""
    found = find(port)
    if found is None:
        click.echo(f"deployment port {port}: nothing listens there, so nothing is stopped", err=True)
        lifecycle.event("absent", "deployment", port=port)
        return
    click.echo(f"stopping the deployment's server on port {port} (pid {found.pid}); it is restored when the bench "
               "ends", err=True)
    held = Standing(found, lifecycle)
    running.callback(_restore, held)
    held.stop()


def _restore(held: Standing) -> None:
    """Bring the deployment back; when it cannot be, say so and exit with the usage code (the bench's figures, if
    any, are not worth a deployment left down)."""
    try:
        held.restore()
    except PowerError as err:
        refuse(err)
    click.echo(f"restored the deployment's server on port {held.server.port} (pid {held.restored})", err=True)
