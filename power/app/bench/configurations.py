"""The configurations `power bench` measures, one per plan: its engine is Power's runtime, loaded in this process, or
a live server launched from the plan's render, whose every start and stop is a lifecycle event
(`power.app.bench.lifecycle`)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import click

from power.app.bench.harness import BenchConfig
from power.app.bench.lifecycle import Lifecycle
from power.orchestrator.engines import LIVE_ENGINES


def load(plans, engine: str, binary: Path | None, device: str, threads: int | None, governor: bool, root: Path | None,
         running: contextlib.ExitStack, lifecycle: Lifecycle, servers: dict, start: bool = True) -> list[BenchConfig]:
    """One configuration per plan, its engine loaded (Power) or, with `start`, started and healthy (live; stopped by
    `running`); the live servers go into `servers` by label, for a run in turns to bring up and take down."""
    from power.app.live import LiveEngine, LiveEngineError
    from power.app.served import ServedEngine
    from power.runtime.engine import Engine, EngineOptions
    from power.runtime.workload import Workload

    configs = []
    for label, path, plan in plans:
        click.echo(f"loading {label}: {path} (mode {plan.mode.resolved}) on {engine}", err=True)
        if engine not in LIVE_ENGINES:  # Power's own runtime, in this process
            options = EngineOptions(device=device, threads=threads, governor=governor)
            runtime_engine = Engine(Workload.of_plan(plan, path, root), options)
            configs.append(BenchConfig(label, Path(path), plan, runtime_engine))
        else:
            if binary is None:
                raise LiveEngineError(f"no {engine} binary to launch", hint="pass --engine-binary PATH")
            server = LiveEngine(engine, plan, Path(path), binary, threads=threads)
            running.callback(take_down, server, label, lifecycle)
            servers[label] = server
            configs.append(BenchConfig(label, Path(path), plan, ServedEngine(server)))
    if start:
        for label, server in servers.items():  # live servers load side by side, then each must be healthy
            server.start_process()
            lifecycle.event("start", label, port=server.port, pid=pid(server))
        for label, server in servers.items():
            server.wait_healthy()
            lifecycle.event("healthy", label, port=server.port, pid=pid(server), load_s=round(server.load_s, 3))
    return configs


def pid(server) -> int | None:
    return server.process.pid if server.process is not None else None


def bring_up(server, label: str, lifecycle: Lifecycle) -> None:
    """Start one configuration's server on its own and wait until it is healthy (its turn)."""
    click.echo(f"starting {label}", err=True)
    server.start_process()
    lifecycle.event("start", label, port=server.port, pid=pid(server))
    server.wait_healthy()
    lifecycle.event("healthy", label, port=server.port, pid=pid(server), load_s=round(server.load_s, 3))


def take_down(server, label: str, lifecycle: Lifecycle) -> None:
    """Stop the server if it runs (a second call, from the exit stack, finds nothing to stop)."""
    running = pid(server)
    if running is not None:
        server.stop()
        lifecycle.event("stop", label, port=server.port, pid=running)
