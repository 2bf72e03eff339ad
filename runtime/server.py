"""`power serve`: an OpenAI-style completions endpoint over one engine, with /health and Prometheus /metrics.

One model, one engine thread: the runtime decodes one request at a time, so
requests wait in a bounded queue (full: 429 with Retry-After) and the engine
thread takes them in order. The HTTP side is starlette on uvicorn; the engine
thread talks to a request's handler through an asyncio queue fed with
`call_soon_threadsafe`.

Faults stay inside their request: bad JSON or parameters are a 400 with a
message; an exception while generating is that request's 500 and the engine
thread carries on; a client that disconnects, or a request past its timeout,
sets the request's cancel event, and the decoder restores its last committed
transaction at the next round boundary. A stop string is a normal end: the
engine finishes after the round that completed it and its receipt says `stop`.
"""

from __future__ import annotations

import asyncio
import json
import math
import queue
import sys
import threading
import time
import traceback
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from power.findings import PowerError
from power.runtime.engine import Engine
from power.runtime.receipt import Receipt
from power.runtime.sampling import SamplingParams

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_STOP_STRINGS = 4
DISCONNECT_POLL_S = 0.25

DECODE_TOK_S_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
TTFT_S_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class BadRequest(ValueError):
    """A request the server refuses with 400: the message says which field and what is allowed."""


@dataclass(frozen=True)
class CompletionRequest:
    prompt: str
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float | None = None  # None: the plan's sampling
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False


@dataclass(frozen=True)
class ServerLimits:
    queue_size: int = 8  # requests waiting behind the one being decoded
    request_timeout_s: float = 300.0  # from arrival to the last token, queue wait included


def parse_completion(body: bytes, max_tokens_limit: int) -> CompletionRequest:
    """Validate a /v1/completions body; unknown fields (model, user, ...) are ignored as OpenAI clients send them."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BadRequest(f"the body is not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object with at least a \"prompt\" string")
    prompt = data.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest("\"prompt\" must be a non-empty string")
    return CompletionRequest(
        prompt=prompt,
        max_tokens=_integer(data, "max_tokens", DEFAULT_MAX_TOKENS, 1, max_tokens_limit),
        temperature=_temperature(data.get("temperature")),
        seed=_optional_integer(data, "seed", 0, 2**63 - 1),
        stop=_stop(data.get("stop")),
        stream=_boolean(data, "stream"),
    )


def _integer(data: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = _optional_integer(data, key, low, high)
    return default if value is None else value


def _optional_integer(data: dict[str, Any], key: str, low: int, high: int) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRequest(f"\"{key}\" must be an integer in [{low}, {high}], got {json.dumps(value)}")
    return value


def _temperature(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 2.0:
        raise BadRequest(f"\"temperature\" must be a number in [0, 2], got {json.dumps(value)}")
    return float(value)


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOP_STRINGS:
        raise BadRequest(f"\"stop\" must be a non-empty string or a list of at most {MAX_STOP_STRINGS} of them")
    return tuple(stops)


def _boolean(data: dict[str, Any], key: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise BadRequest(f"\"{key}\" must be true or false, got {json.dumps(value)}")
    return value


class Metrics:
    """The server's Prometheus metrics, in a registry of their own (one per app)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.drafts = Counter("power_spec_drafts", "Speculative rounds that proposed at least one token.", registry=r)
        self.draft_tokens = Counter("power_spec_draft_tokens", "Proposed draft tokens.", registry=r)
        self.accepted_tokens = Counter("power_spec_accepted_tokens", "Draft tokens the target accepted.", registry=r)
        self.replays = Counter("power_spec_replays", "Exact replays (a rejected suffix beyond the resident window).", registry=r)
        self.clamps = Counter("power_spec_clamps", "Requests clamped to S proposals after a replay.", registry=r)
        self.fallbacks = Counter("power_spec_fallbacks", "One-way adaptive fallbacks to the target.", registry=r)
        self.governor_parks = Counter("power_governor_parks", "Times the cost governor parked the speculator.", registry=r)
        self.generated_tokens = Counter("power_generated_tokens", "Tokens emitted.", registry=r)
        self.requests = Counter("power_requests", "Completion requests by outcome.", ["status"], registry=r)
        self.decode_tok_s = Histogram("power_decode_tokens_per_second", "Per-request decode rate (tokens after the first).",
                                      buckets=DECODE_TOK_S_BUCKETS, registry=r)
        self.ttft = Histogram("power_time_to_first_token_seconds", "Arrival to the first streamed text, queue wait included.",
                              buckets=TTFT_S_BUCKETS, registry=r)
        self.queue_depth = Gauge("power_queue_depth", "Requests waiting for the engine thread.", registry=r)
        self.ready = Gauge("power_ready", "1 once the plan's model is loaded.", registry=r)

    def record_receipt(self, receipt: Receipt) -> None:
        self.drafts.inc(receipt.speculative_rounds)
        self.draft_tokens.inc(receipt.proposed)
        self.accepted_tokens.inc(receipt.accepted)
        self.replays.inc(receipt.replays)
        self.clamps.inc(receipt.clamps)
        self.fallbacks.inc(receipt.fallbacks)
        self.governor_parks.inc(receipt.governor_parks)
        self.generated_tokens.inc(len(receipt.token_ids))
        if len(receipt.token_ids) > 1:
            self.decode_tok_s.observe(receipt.decode_tok_s)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


@dataclass
class Outcome:
    """What the engine thread hands back for one request."""

    receipt: Receipt  # its text is what the client was sent (cut before a stop string)
    finish_reason: str  # "stop" or "length"; a cancelled request has no finish reason


@dataclass
class Job:
    request: CompletionRequest
    loop: asyncio.AbstractEventLoop
    arrived: float = field(default_factory=time.perf_counter)
    cancel: threading.Event = field(default_factory=threading.Event)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)  # ("text", str) ... then ("done", Outcome) | ("error", (status, message))

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
    """The one thread that runs the engine: requests in arrival order, one at a time."""

    def __init__(self, engine: Engine, metrics: Metrics, queue_size: int) -> None:
        self.engine = engine
        self.metrics = metrics
        self.jobs: queue.Queue[Job | None] = queue.Queue(maxsize=queue_size)
        self.service_s = 1.0  # moving average of a request's engine time, for Retry-After
        self.current: Job | None = None  # the request being decoded
        metrics.queue_depth.set_function(self.jobs.qsize)
        self.thread = threading.Thread(target=self._run, name="power-engine", daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> None:
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            raise QueueFull(max(1, math.ceil(self.service_s * (self.jobs.qsize() + 1)))) from None

    def stop(self) -> None:
        if self.current is not None:  # the request in hand ends at its next step boundary
            self.current.cancel.set()
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

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            if job.cancel.is_set():
                continue  # its client left (or its time ran out) while it waited
            started = time.perf_counter()
            self.current = job
            self._execute(job)
            self.current = None
            self.service_s = 0.8 * self.service_s + 0.2 * (time.perf_counter() - started)

    def _execute(self, job: Job) -> None:
        request = job.request
        first = True

        def on_text(piece: str) -> None:
            nonlocal first
            if first:
                self.metrics.ttft.observe(time.perf_counter() - job.arrived)
                first = False
            job.push("text", piece)

        try:
            receipt = self.engine.generate(request.prompt, request.max_tokens, on_text, cancel=job.cancel,
                                           sampling=self._sampling(request), stop=request.stop)
        except PowerError as err:
            job.push("error", (400, err.finding.message))
            return
        except Exception:  # one request's failure must not take the engine thread down
            traceback.print_exc(file=sys.stderr)
            job.push("error", (500, "the engine failed on this request; the server carries on (see its log)"))
            return
        self.metrics.record_receipt(receipt)
        job.push("done", Outcome(receipt, "stop" if receipt.stop_reason == "stop" else "length"))

    def _sampling(self, request: CompletionRequest) -> SamplingParams:
        plan = self.engine.sampling
        return SamplingParams(
            temperature=plan.temperature if request.temperature is None else request.temperature,
            top_k=plan.top_k, top_p=plan.top_p, verify=plan.verify,
            seed=plan.seed if request.seed is None else request.seed,
        )


@dataclass
class ServerState:
    model: str
    plan_digest: str | None
    limits: ServerLimits
    metrics: Metrics = field(default_factory=Metrics)
    worker: EngineWorker | None = None
    load_error: str | None = None


def create_app(load_engine: Callable[[], Engine], model: str, plan_digest: str | None,
               limits: ServerLimits = ServerLimits(), on_load_failure: Callable[[str], None] | None = None) -> Starlette:
    """The ASGI app. The engine loads on a background thread at startup; /health answers 503 until it is ready."""
    state = ServerState(model, plan_digest, limits)

    def load() -> None:
        try:
            engine = load_engine()
        except Exception as err:  # noqa: BLE001 - reported on /health and to the operator, never a dead thread
            if isinstance(err, PowerError):
                state.load_error = err.finding.message
                print(f"the model did not load:\n{err.finding.render()}", file=sys.stderr)
            else:
                state.load_error = f"{type(err).__name__}: {err}"
                print(f"error: the model did not load: {state.load_error}", file=sys.stderr)
            if on_load_failure:
                on_load_failure(state.load_error)
            return
        state.worker = EngineWorker(engine, state.metrics, limits.queue_size)
        state.metrics.ready.set(1)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        threading.Thread(target=load, name="power-load", daemon=True).start()
        yield
        if state.worker:
            state.worker.stop()

    async def health(_request: Request) -> Response:
        if state.worker is not None:
            return JSONResponse({"status": "ok", "model": state.model, "plan_digest": state.plan_digest})
        if state.load_error is not None:
            return JSONResponse({"status": "error", "error": state.load_error}, status_code=503)
        return JSONResponse({"status": "loading", "model": state.model}, status_code=503)

    async def metrics(_request: Request) -> Response:
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def completions(request: Request) -> Response:
        return await _completions(request, state)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


async def _completions(request: Request, state: ServerState) -> Response:
    count = state.metrics.requests
    if state.worker is None:
        count.labels("unavailable").inc()
        if state.load_error is not None:
            return _error(503, f"the model failed to load: {state.load_error}", "unavailable")
        return _error(503, "the model is not loaded yet; poll GET /health until it answers 200", "unavailable")
    try:
        parsed = parse_completion(await request.body(), state.worker.engine.n_ctx)
    except BadRequest as err:
        count.labels("bad_request").inc()
        return _error(400, str(err), "invalid_request_error")
    job = Job(parsed, asyncio.get_running_loop())
    try:
        state.worker.submit(job)
    except QueueFull as err:
        count.labels("rejected").inc()
        return _error(429, str(err), "queue_full", headers={"Retry-After": str(err.retry_after_s)})
    identity = _identity(state)
    if parsed.stream:
        return StreamingResponse(_stream(job, state, identity), media_type="text/event-stream")
    return await _collect(job, request, state, identity)


def _identity(state: ServerState) -> dict[str, Any]:
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()), "model": state.model}


async def _next_event(job: Job, until: float) -> tuple[str, Any]:
    """The job's next event, or ("tick", None) when none came before `until` (a perf_counter time)."""
    try:
        return await asyncio.wait_for(job.events.get(), timeout=max(0.0, until - time.perf_counter()))
    except asyncio.TimeoutError:
        return "tick", None


async def _collect(job: Job, request: Request, state: ServerState, identity: dict[str, Any]) -> Response:
    deadline = job.arrived + state.limits.request_timeout_s
    count = state.metrics.requests
    while True:
        kind, payload = await _next_event(job, min(deadline, time.perf_counter() + DISCONNECT_POLL_S))
        if kind == "tick":
            if time.perf_counter() >= deadline:
                job.cancel.set()
                count.labels("timeout").inc()
                return _error(504, _timeout_message(state), "timeout")
            if await request.is_disconnected():
                job.cancel.set()
                count.labels("cancelled").inc()
                return _error(499, "client disconnected", "cancelled")
            continue
        if kind == "error":
            status, message = payload
            count.labels("error" if status >= 500 else "bad_request").inc()
            return _error(status, message, "engine_error" if status >= 500 else "invalid_request_error")
        if kind == "done":
            count.labels("ok").inc()
            return JSONResponse(_completion_body(identity, payload))


async def _stream(job: Job, state: ServerState, identity: dict[str, Any]) -> AsyncIterator[str]:
    deadline = job.arrived + state.limits.request_timeout_s
    finished = False
    try:
        while True:
            kind, payload = await _next_event(job, deadline)
            if kind == "text":
                yield _sse(identity | {"choices": [{"index": 0, "text": payload, "finish_reason": None, "logprobs": None}]})
                continue
            finished = True
            yield _sse(_last_event(kind, payload, job, state, identity))
            yield "data: [DONE]\n\n"
            return
    finally:
        if not finished:  # the client went away mid-stream: cancel, and the decoder rolls back its open round
            job.cancel.set()
            state.metrics.requests.labels("cancelled").inc()


def _last_event(kind: str, payload: Any, job: Job, state: ServerState, identity: dict[str, Any]) -> dict[str, Any]:
    """The stream's closing event (the receipt, a timeout or an error), counted by outcome."""
    count = state.metrics.requests
    if kind == "done":
        count.labels("ok").inc()
        body = _completion_body(identity, payload)
        body["choices"][0]["text"] = ""  # the text went out in the chunks before
        return body
    if kind == "tick":
        job.cancel.set()
        count.labels("timeout").inc()
        return {"error": {"message": _timeout_message(state), "type": "timeout"}}
    status, message = payload
    count.labels("error" if status >= 500 else "bad_request").inc()
    return {"error": {"message": message, "type": "engine_error" if status >= 500 else "invalid_request_error"}}


def _timeout_message(state: ServerState) -> str:
    return f"the request took longer than {state.limits.request_timeout_s:g} s and was cancelled; raise --timeout or lower max_tokens"


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def _completion_body(identity: dict[str, Any], outcome: Outcome) -> dict[str, Any]:
    receipt = outcome.receipt
    return identity | {
        "choices": [{"index": 0, "text": receipt.text, "finish_reason": outcome.finish_reason, "logprobs": None}],
        "usage": {"prompt_tokens": receipt.prompt_tokens, "completion_tokens": len(receipt.token_ids),
                  "total_tokens": receipt.prompt_tokens + len(receipt.token_ids)},
        "timings": timings(receipt),
        "receipt": receipt.document(),
    }


def timings(receipt: Receipt) -> dict[str, Any]:
    """llama.cpp-style per-request timings, so clients that read those read ours."""
    return {
        "prompt_n": receipt.prompt_tokens, "prompt_ms": receipt.prefill_s * 1e3, "prompt_per_second": receipt.prefill_tok_s,
        "predicted_n": len(receipt.token_ids), "predicted_ms": receipt.decode_s * 1e3,
        "predicted_per_second": receipt.decode_tok_s,
        "draft_n": receipt.proposed, "draft_n_accepted": receipt.accepted, "tokens_sha256": receipt.tokens_sha256,
    }


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status, headers=headers)
