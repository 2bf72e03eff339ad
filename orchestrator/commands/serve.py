"""`power serve PLAN [--host 127.0.0.1 --port N]`: the Power runtime behind OpenAI-style HTTP, /health and /metrics."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from power.findings import PowerError
from power.orchestrator.cli import EXIT_USAGE, refuse
from power.orchestrator.commands.runtime_options import runtime_options


@click.command("serve")
@click.argument("plan", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback by default).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="Port to bind (0: any free port).")
@click.option("--queue-size", type=click.IntRange(min=1), default=8, show_default=True,
              help="Requests that may wait behind the one being decoded; more are refused with 429 and Retry-After.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1), default=300.0, show_default=True,
              help="Seconds a request may take from arrival to its last token (queue wait included) before it is cancelled.")
@runtime_options(default_dtype="bfloat16")
def serve(plan: Path, host: str, port: int, queue_size: int, timeout_s: float, device: str, dtype: str,
          lm_head_dtype: str | None, threads: int | None) -> None:
    """Serve a resolved PLAN: POST /v1/completions (streaming SSE or not), GET /health, GET /metrics.

    /health answers 503 until the plan's model is loaded, then 200. Exit codes:
    0 stopped cleanly, 2 usage or input error (a file that is not a valid plan, a
    model that does not load).
    """
    import uvicorn

    from power.orchestrator.plan import load_plan
    from power.runtime.engine import Engine, EngineOptions, Workload
    from power.runtime.server import ServerLimits, create_app

    try:
        resolved = load_plan(plan)
    except PowerError as err:
        refuse(err)
    workload = Workload.of_plan(resolved, plan)
    options = EngineOptions(device=device, dtype=dtype, lm_head_dtype=lm_head_dtype, threads=threads)
    server: uvicorn.Server | None = None
    failed: list[str] = []

    def stop_on_load_failure(message: str) -> None:
        failed.append(message)
        if server is not None:
            server.should_exit = True

    app = create_app(lambda: Engine(workload, options), resolved.name, resolved.digest,
                     ServerLimits(queue_size=queue_size, request_timeout_s=timeout_s), stop_on_load_failure)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=5))
    server.run()
    if failed:
        sys.exit(EXIT_USAGE)

