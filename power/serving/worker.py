"""The one engine thread: it admits queued requests into free slots, steps the engine, and hands each request's
text and outcome back to its handler through the handler's asyncio queue."""

from __future__ import annotations

import asyncio
import math
import queue
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Any

from power.findings import PowerError
from power.runtime.engine import Engine, Ticket
from power.runtime.sampling import SamplingParams
from power.serving.metrics import Metrics
from power.serving.requests import CompletionRequest
from power.serving.responses import Outcome


@dataclass(eq=False)
class Job:
    request: CompletionRequest
    prompt_ids: list[int]
    loop: asyncio.AbstractEventLoop
    arrived: float = field(default_factory=time.perf_counter)
    cancel: threading.Event = field(default_factory=threading.Event)
    events: asyncio.Queue = field(
        default_factory=asyncio.Queue
    )  # a stream's ("text", str) ... then ("done", Outcome) | ("error", (status, message))

    def push(self, kind: str, payload: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:  # the event loop is gone: the server is shutting down
            pass


class QueueFull(Exception):
    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"the request queue is full; retry in {retry_after_s} s")
        self.retry_after_s = retry_after_s


class EngineWorker:
    """The one thread that runs the engine: it admits queued requests into free slots and steps the engine."""

    def __init__(self, engine: Engine, metrics: Metrics, queue_size: int) -> None:
        self.engine = engine
        self.metrics = metrics
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        # Admission counts free slots and queue places together: a burst must not see 429 while slots are idle
        # only because the engine thread has not yet moved the first arrivals into them.
        self.capacity = engine.slots + queue_size
        self.service_s = 1.0  # moving average of a request's time in a slot, for Retry-After
        self.running: dict[Job, float] = {}  # requests in slots -> when they took one
        self._lock = threading.Lock()
        self.failure: str | None = None  # why the engine thread stopped, once it has
        metrics.queue_depth.set_function(self.jobs.qsize)
        metrics.slots_busy.set_function(lambda: len(self.running))
        self.thread = threading.Thread(target=self._run, name="power-engine", daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> None:
        with self._lock:
            waiting = self.jobs.qsize()
            if len(self.running) + waiting >= self.capacity:
                waves = (waiting + 1) / self.engine.slots
                raise QueueFull(max(1, math.ceil(self.service_s * waves)))
            self.jobs.put_nowait(job)

    def stop(self) -> None:
        with self._lock:
            for running in self.running:  # the requests in hand end at their next round boundary
                running.cancel.set()
        while True:  # and every waiting one is refused
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancel.set()
                job.push("error", (503, "the server is shutting down"))
        self.jobs.put(None)
        self.thread.join(timeout=30)

    @property
    def alive(self) -> bool:
        return self.failure is None and self.thread.is_alive()

    def _run(self) -> None:
        try:
            while self._admit():
                if self.engine.busy:
                    self.engine.step()
        except Exception as err:  # noqa: BLE001 - the engine's state is unknown now: fail loudly, never hang
            traceback.print_exception(err, file=sys.stderr)
            self.failure = f"{type(err).__name__}: {err}"
            self._fail_everything(f"the engine failed ({self.failure}); the server must be restarted")

    def _fail_everything(self, message: str) -> None:
        """Every request in hand or waiting ends with `message` (a 503): a dead engine answers nobody."""
        with self._lock:
            running, self.running = list(self.running), {}
        for job in running:
            job.push("error", (503, message))
        while True:
            try:
                waiting = self.jobs.get_nowait()
            except queue.Empty:
                return
            if waiting is not None:
                waiting.push("error", (503, message))

    def _admit(self) -> bool:
        """Move queued requests into free slots (waiting for one when the engine is idle); False once stopped."""
        block = not self.engine.busy
        while self.engine.free_slots > 0:
            try:
                job = self.jobs.get(block=block)
            except queue.Empty:
                return True
            block = False
            if job is None:
                return False
            if not job.cancel.is_set():  # else its client left (or its time ran out) while it waited
                self._start(job)
        return True

    def _start(self, job: Job) -> None:
        request = job.request
        first = True

        def on_text(piece: str) -> None:
            nonlocal first
            if first:
                self.metrics.ttft.observe(time.perf_counter() - job.arrived)
                first = False
            if request.stream:  # a plain response takes its text from the receipt: no hop to the event loop a round
                job.push("text", piece)

        try:
            self.engine.submit(job.prompt_ids, request.max_tokens, on_text, cancel=job.cancel,
                               sampling=self._sampling(request), stop=request.stop,
                               on_done=lambda ticket: self._done(job, ticket))
        except PowerError as err:
            job.push("error", (400, err.finding.message))
            return
        except Exception as err:  # noqa: BLE001 - one request's failure must not take the engine thread down
            traceback.print_exception(err, file=sys.stderr)
            job.push("error", (500, f"the engine could not start this request ({type(err).__name__}); the server "
                                    "carries on"))
            return
        with self._lock:
            self.running[job] = time.perf_counter()

    def _done(self, job: Job, ticket: Ticket) -> None:
        with self._lock:
            started = self.running.pop(job, None)
        if started is not None:
            self.service_s = 0.8 * self.service_s + 0.2 * (time.perf_counter() - started)
        if isinstance(ticket.error, PowerError):
            job.push("error", (400, ticket.error.finding.message))
        elif ticket.error is not None:  # one request's failure must not take the engine thread down
            traceback.print_exception(ticket.error, file=sys.stderr)
            job.push("error", (500, "the engine failed on this request; the server carries on (see its log)"))
        else:
            receipt = ticket.result()
            self.metrics.record_receipt(receipt)
            job.push("done", Outcome(receipt, "stop" if receipt.stop_reason == "stop" else "length"))

    def _sampling(self, request: CompletionRequest) -> SamplingParams:
        plan = self.engine.sampling
        return replace(plan, temperature=plan.temperature if request.temperature is None else request.temperature,
                       seed=plan.seed if request.seed is None else request.seed)
