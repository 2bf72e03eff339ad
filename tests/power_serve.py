"""A real `power serve` in a subprocess, for the tests that talk to it over HTTP as a client would."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from power.app.bench.standing import healthy
from power.app.live import free_port

BOUND_S = 120.0


@dataclass
class Served:
    base: str  # http://127.0.0.1:PORT
    process: subprocess.Popen[str]
    output: str = ""  # what the server printed, once it stopped


@contextmanager
def power_serve(plan: Path, *options: str, env: Mapping[str, str] | None = None,
                bound_s: float = BOUND_S) -> Iterator[Served]:
    """`power serve PLAN --port P OPTIONS...` on a free loopback port, yielded once `/health` answers (it needs no
    key) within `bound_s`; terminated on exit, its output kept in `Served.output`."""
    port = free_port()
    command = [str(Path(sys.executable).parent / "power"), "serve", str(plan), "--port", str(port), *options]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=dict(env if env is not None else os.environ))
    served = Served(f"http://127.0.0.1:{port}", process)
    try:
        deadline = time.monotonic() + bound_s
        while not healthy(port):
            assert process.poll() is None, process.stdout.read() if process.stdout else ""
            assert time.monotonic() < deadline, "power serve did not come up"
            time.sleep(0.2)
        yield served
    finally:
        process.terminate()
        served.output = process.communicate(timeout=bound_s)[0]
