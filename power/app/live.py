"""A live engine launched from a rendered plan: llama-server (or vLLM) on a free loopback port, for `power bench`.

The command line is `render.engine_launch`'s, the one every render of the plan
prints, plus the machine's thread count (a host choice, not the plan's) and a
loopback address. `LiveEngine` verifies every artifact the plan names (the seal), starts the server it owns, polls
`/health`, completes prompts, reads the engine's own counters (llama-server: the
per-request `timings.draft_n` / `draft_n_accepted`, and `/metrics` for the
verification steps and decode calls a request took), and stops exactly the
process it started, in `stop` (callers register `stop` on an ExitStack, so the
server stops in a `finally`). Nothing else on the machine is touched: the port
is a free one, never a configured one.

A completion comes back as the engine gave it (`Completion`); `power.app.served`
turns it into a receipt, so the A/B harness measures a live engine and Power's
runtime alike.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from power.artifacts.verify import verified_sha256
from power.documents.plan import ResolvedPlan, planned_artifacts
from power.findings import PowerError
from power.orchestrator.engines import Launch, LiveBench, adapter
from power.orchestrator.launch.render import Listen, engine_launch
from power.threads import environment_for_other_programs

LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 1800.0


def protocol(engine: str) -> LiveBench:
    """How the harness talks to `engine` live (its folder's record: counters, executable variable, API shape);
    KeyError for Power's runtime, which the bench runs in its own process."""
    record = adapter(engine).live
    if record is None:
        raise KeyError(f"{engine} runs in the bench's own process, not as a live engine")
    return record


class LiveEngineError(PowerError):
    """A live engine that is missing, will not start, or fails a request; the message says what and the fix."""

    code = "PWR470"


def engine_binary(engine: str, given: Path | None = None) -> Path:
    """The engine's executable: `given`, else $POWER_LLAMA_SERVER / $POWER_VLLM, else PATH; fail closed without one."""
    variable = protocol(engine).binary_env
    candidate = given or (Path(os.environ[variable]) if os.environ.get(variable) else None)
    found = candidate if candidate is not None else (Path(which) if (which := shutil.which(engine)) else None)
    if found is None or not found.is_file() or not os.access(found, os.X_OK):
        where = str(candidate) if candidate is not None else f"{engine} on PATH"
        raise LiveEngineError(f"the {engine} engine is not here: no executable {where}",
                              hint=protocol(engine).install_hint)
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


@dataclass
class LiveEngine:
    """One engine process running `plan` (as `power render --target ENGINE` prints it) on a loopback port."""

    engine: str
    plan: ResolvedPlan
    plan_path: Path
    binary: Path
    threads: int | None = None
    port: int = 0
    process: subprocess.Popen | None = None
    log_path: Path | None = None
    load_s: float = 0.0
    build: str = ""
    artifacts: dict[str, str] = field(default_factory=dict)
    _started: float = 0.0

    # --- lifecycle ---------------------------------------------------------------------------------

    def argv(self, port: int) -> list[str]:
        """The rendered command line, the binary in place of its program name, on `port`, with the machine's threads."""
        return self._words(self._launch(port))

    def _launch(self, port: int) -> Launch:
        """The rendered line on `port`; a plan sized for another engine is measured here (bench
        says so), not refused."""
        return engine_launch(self.plan, self.engine, self.plan_path, Listen(LOOPBACK, port), measuring=True)

    def _words(self, launch: Launch) -> list[str]:
        words = [str(self.binary), *launch.argv[1:]]
        if self.threads:
            words += [word for flag in protocol(self.engine).thread_flags for word in (flag, str(self.threads))]
        return words

    def start_process(self) -> None:
        """Launch the rendered line on a free loopback port (several engines may load at once, then wait).

        Every artifact the plan names is hashed in full first (the seal): an engine never starts on a file that is
        not the one the plan was compiled with."""
        self.artifacts = {str(artifact.path): verified_sha256(artifact) for artifact in planned_artifacts(self.plan)}
        self._started = time.perf_counter()
        self.port = free_port()
        launch = self._launch(self.port)
        handle, name = tempfile.mkstemp(prefix=f"power-{self.engine}-", suffix=".log")
        self.log_path = Path(name)
        with os.fdopen(handle, "wb") as log:
            self.process = subprocess.Popen(self._words(launch), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL,
                                            env={**environment_for_other_programs(), **launch.env},
                                            start_new_session=True)

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                status = self.process.returncode if self.process is not None else "none"
                raise LiveEngineError(f"{self.engine} exited with status {status} before it was healthy: "
                                      f"{self.log_tail()}", code="PWR471", file=str(self.log_path),
                                      hint="run the rendered line by hand (`power render PLAN --target "
                                      f"{self.engine}`) to see the whole log")
            if self.healthy():
                self.load_s = time.perf_counter() - self._started
                self.build = self._build()
                return
            time.sleep(0.5)
        self.stop()
        raise LiveEngineError(f"{self.engine} did not answer /health within {timeout_s:.0f} s: {self.log_tail()}",
                              code="PWR471", file=str(self.log_path))

    def stop(self) -> None:
        """Stop the process this object started (and nothing else)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def log_tail(self, lines: int = 12) -> str:
        return " | ".join(line for line in self.log_text().splitlines()[-lines:] if line.strip())

    # --- HTTP ---------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def get_json(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=60) as response:
            return json.load(response)

    def post_json(self, path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(f"{self.url}{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                return json.load(response)
        except urllib.error.HTTPError as err:
            raise LiveEngineError(f"{self.engine} refused {path}: HTTP {err.code} {err.read()[:500]!r}",
                                  code="PWR472") from None
        except (urllib.error.URLError, OSError) as err:
            raise LiveEngineError(f"{self.engine} did not answer {path} ({err}): {self.log_tail()}",
                                  code="PWR472") from None

    def props(self) -> dict[str, Any]:
        return self.get_json("/props")

    def metrics(self) -> dict[str, float]:
        """The engine's Prometheus counters, without their `llamacpp:` / `vllm:` prefix."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=60) as response:
            text = response.read().decode()
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#") or " " not in line:
                continue
            name, value = line.rsplit(" ", 1)
            if "{" in name:
                continue
            try:
                values[name.split(":", 1)[-1]] = float(value)
            except ValueError:
                continue
        return values

    def _build(self) -> str:
        if protocol(self.engine).native:
            return str(self.props().get("build_info", ""))
        return str(self.get_json("/version").get("version", ""))

    # --- completions -------------------------------------------------------------------------------

    def identity(self) -> dict[str, Any]:
        return {"name": self.engine, "build": self.build, "binary": str(self.binary), "threads": self.threads}

    def complete(self, prompt: str, max_tokens: int, temperature: float, seed: int) -> Completion:
        """One completion of `prompt`, with the engine's /metrics counters read around it."""
        talk = protocol(self.engine)
        before = self.metrics()
        started = time.perf_counter()
        if talk.native:
            body = self.post_json("/completion", {
                "prompt": prompt, "n_predict": max_tokens, "temperature": temperature, "seed": seed,
                "cache_prompt": False, "return_tokens": True})
        else:
            body = self.post_json("/v1/completions", {
                "model": self.plan.name, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
                "seed": seed, "return_token_ids": True})
        wall_s = time.perf_counter() - started
        after = self.metrics()
        return Completion(
            self.engine, body, {name: after.get(name, 0.0) - before.get(name, 0.0) for name in talk.counters}, wall_s
        )


@dataclass(frozen=True)
class Completion:
    """One request's answer as the engine gave it, and what its counters moved by while it ran."""

    engine: str
    body: dict[str, Any]  # llama-server's /completion response, or vLLM's /v1/completions response
    counters: dict[str, float]  # /metrics deltas (names without the engine's prefix)
    wall_s: float
