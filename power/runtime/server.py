"""`power serve`: OpenAI-compatible completions and chat over one engine, with /health and Prometheus /metrics.

One model, one engine thread. The engine decodes up to the plan's `slots`
requests side by side (`power.runtime.decoder`); more wait in a bounded queue
(full: 429 with Retry-After) and take slots in arrival order as they free. The
HTTP side is starlette on uvicorn; the engine thread talks to a request's handler
through an asyncio queue fed with `call_soon_threadsafe`.

The event loop never does a request's heavy work: a body is read up to a size
limit (413 past it), and parsing, chat-template rendering and tokenizing run on a
worker thread, under the request's timeout, after a length check that needs no
tokenizer. Faults stay inside their request: bad input is a 400 naming the field,
an exception while generating is that request's 500 and the others go on, and
any other failure is still a JSON error in OpenAI's shape, counted. A client
that disconnects (noticed at once, streaming or not), or a request past its
timeout, sets the request's cancel event, and the decoder restores its last
committed transaction at the next round boundary. A stop string is a normal end.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import queue
import sys
import threading
import time
import traceback
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Callable

import h11
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from power.documents.receipt import Receipt
from power.findings import PowerError
from power.runtime.chat import ChatTemplate
from power.runtime.engine import Engine, Ticket
from power.runtime.errors import ContextOverflow
from power.runtime.sampling import SamplingParams
from power.runtime.template_sandbox import TemplateSandbox

ClientText = Callable[[str], str]  # a client's text as the model reads it (`Tokenizer.as_text`)

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_STOP_STRINGS = 4
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")

DECODE_TOK_S_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
TTFT_S_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class BadRequest(ValueError):
    """A request the server refuses with 400: the message says which field (`param`) and what is allowed."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.code = param, code


class TooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is larger than {limit} bytes")
        self.limit = limit


@dataclass(frozen=True)
class CompletionRequest:
    prompt: str  # for a chat request: the messages rendered through the chat template
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float | None = None  # None: the plan's sampling
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    chat: bool = False
    add_bos: bool | None = None  # None: as the model says (a rendered chat template may already carry BOS)


@dataclass(frozen=True)
class Access:
    """Who may call the server: with an `api_key`, every route but /health (and /metrics when `public_metrics`)
    needs `Authorization: Bearer <key>`, as OpenAI's API and llama-server's --api-key do."""

    api_key: str | None = None
    public_metrics: bool = False

    def open_paths(self) -> frozenset[str]:
        return frozenset({"/health", "/metrics"} if self.public_metrics else {"/health"})


class _RequireKey:
    """ASGI middleware: a request without the key is answered 401 in OpenAI's shape before any route runs.

    The key is compared in constant time (`hmac.compare_digest`), so its bytes cannot be guessed from how long a
    refusal takes."""

    def __init__(self, app: Any, access: Access, refused: Counter) -> None:
        assert access.api_key is not None, "only installed with a key"
        self.app, self.key, self.open = app, b"Bearer " + access.api_key.encode("utf-8"), access.open_paths()
        self.refused = refused

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in self.open:
            given = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
            if not hmac.compare_digest(given, self.key):
                message = ("Incorrect API key provided" if given else
                           "You didn't provide an API key: send it as 'Authorization: Bearer KEY'")
                response = _error(401, message, "invalid_request_error", code="invalid_api_key",
                                  headers={"WWW-Authenticate": "Bearer"})
                self.refused.labels("wrong" if given else "missing").inc()
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


@dataclass(frozen=True)
class ServerLimits:
    queue_size: int = 8  # requests waiting for a slot
    request_timeout_s: float = 300.0  # from arrival to the last token, queue wait included
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    headers_timeout_s: float = 10.0  # from connecting (or the previous response) to a request's last header line
    body_timeout_s: float = 30.0  # from the headers to the body's last byte (408 past it)


def http_protocol(limits: ServerLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline for each request's headers: a client that opens connections and
    sends its headers a byte at a time (slowloris) is cut off after `headers_timeout_s`, which uvicorn itself never
    does (its keep-alive timer stops at the first byte)."""

    class HeadersDeadline(H11Protocol):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self.headers_deadline = self.loop.call_later(limits.headers_timeout_s, self._expired)

        def _disarm(self) -> None:
            deadline = getattr(self, "headers_deadline", None)
            if deadline is not None:
                deadline.cancel()

        def _expired(self) -> None:
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():  # its headers never came
                self.transport.close()

    return HeadersDeadline


# --- request bodies ----------------------------------------------------------------------------------------------


def parse_completion(body: bytes, max_tokens_limit: int, as_text: ClientText) -> CompletionRequest:
    """Validate a /v1/completions body; unknown fields (model, user, ...) are ignored as OpenAI clients send them.
    The prompt is the client's text: `as_text` (`Tokenizer.as_text`) keeps its control-token texts text."""
    data = _json_object(body, "a \"prompt\" string")
    prompt = data.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest("\"prompt\" must be a non-empty string", "prompt")
    return CompletionRequest(prompt=_text(prompt, "prompt", as_text),
                             **_sampling_fields(data, "max_tokens", max_tokens_limit))


def parse_chat(body: bytes, max_tokens_limit: int, template: ChatTemplate | None,
               template_problem: str | None, max_chars: int, as_text: ClientText,
               budget_s: float | None = None) -> CompletionRequest:
    """Validate a /v1/chat/completions body and render its messages through the model's chat template (in its
    sandbox: at most `max_chars` characters, within `budget_s` seconds). Each message's content is the client's
    text (`as_text`): only the template's own markers become control tokens."""
    data = _json_object(body, "a \"messages\" list")
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("\"messages\" must be a non-empty list of {\"role\", \"content\"} objects", "messages")
    limit_key = "max_completion_tokens" if data.get("max_completion_tokens") is not None else "max_tokens"
    fields = _sampling_fields(data, limit_key, max_tokens_limit)
    if template is None:
        raise BadRequest(template_problem or "this server has no chat template", "messages", "no_chat_template")
    try:
        prompt = template.render([_message(m, i, as_text) for i, m in enumerate(messages)], max_chars, budget_s)
    except PowerError as err:
        raise BadRequest(err.finding.message, "messages") from None
    add_bos = False if template.bos_token and prompt.startswith(template.bos_token) else None
    return CompletionRequest(prompt=prompt, chat=True, add_bos=add_bos, **fields)


def _json_object(body: bytes, needs: str) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BadRequest(f"the body is not valid JSON ({err})") from None
    except RecursionError:
        raise BadRequest("the body is nested too deeply to be a request") from None
    except ValueError as err:  # an integer with more digits than Python converts
        raise BadRequest(f"the body has a number the server does not read ({err})") from None
    if not isinstance(data, dict):
        raise BadRequest(f"the body must be a JSON object with at least {needs}")
    return data


# OpenAI parameters this server does not implement, with the values that ask for nothing (null is always fine).
# Anything else is refused, naming the parameter: a request is never answered as if it had not asked.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "top_p": (1,), "presence_penalty": (0,), "frequency_penalty": (0,), "logprobs": (False, 0), "top_logprobs": (0,),
    "logit_bias": ({},), "best_of": (1,), "echo": (False,), "suffix": ("",), "n": (1,), "tools": ([],),
    "response_format": ({"type": "text"},),
    # llama.cpp's and vLLM's own sampling fields: a client that sends them means them
    "top_k": (0, -1), "min_p": (0,), "ignore_eos": (False,),
}


def _refuse_unsupported(data: dict[str, Any]) -> None:
    for key, neutral in UNSUPPORTED.items():
        value = data.get(key)
        if value is not None and not any(_same(value, v) for v in neutral):
            raise BadRequest(f"\"{key}\" is not supported by this server: it samples from the plan's temperature "
                             f"distribution and answers plain text; omit it or send {json.dumps(neutral[0])}",
                             key, "unsupported_parameter")


def _same(value: Any, neutral: Any) -> bool:
    """`value` is `neutral` as JSON means it: 1.0 is 1, but true is not 1 and 0 is not false."""
    numbers = (int, float)
    if isinstance(neutral, numbers) and not isinstance(neutral, bool):
        return isinstance(value, numbers) and not isinstance(value, bool) and value == neutral
    return type(value) is type(neutral) and value == neutral


def _sampling_fields(data: dict[str, Any], max_tokens_key: str, max_tokens_limit: int) -> dict[str, Any]:
    _refuse_unsupported(data)
    return {
        "max_tokens": _integer(data, max_tokens_key, DEFAULT_MAX_TOKENS, 1, max_tokens_limit),
        "temperature": _temperature(data.get("temperature")),
        "seed": _optional_integer(data, "seed", 0, 2**63 - 1),
        "stop": _stop(data.get("stop")),
        "stream": _boolean(data, "stream"),
    }


def _message(message: Any, index: int, as_text: ClientText) -> dict[str, str]:
    """One chat message as the template reads it: {"role", "content"} with the content as plain text."""
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise BadRequest(f"\"{where}\" must be an object with \"role\" and \"content\"", where)
    role, content = message.get("role"), message.get("content")
    if role not in CHAT_ROLES:
        raise BadRequest(f"\"{where}.role\" must be one of {', '.join(CHAT_ROLES)}, got {json.dumps(role)}",
                         f"{where}.role")
    if isinstance(content, list):  # OpenAI's content parts: only text parts carry text for this model
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise BadRequest(f"\"{where}.content\" parts must be {{\"type\": \"text\", \"text\": ...}}: this model "
                             f"reads text only", f"{where}.content")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise BadRequest(f"\"{where}.content\" must be a string or a list of text parts", f"{where}.content")
    return {"role": role, "content": _text(content, f"{where}.content", as_text)}


def _text(value: str, name: str, as_text: ClientText | None = None) -> str:
    """`value` if it is Unicode text (JSON lets a lone surrogate such as \\ud800 through; UTF-8 cannot carry one),
    through `as_text` when the model reads it (a client's text never becomes control tokens)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise BadRequest(f"\"{name}\" is not valid Unicode: a lone surrogate at character {err.start}", name) from None
    try:
        return as_text(value) if as_text is not None else value
    except ValueError as err:
        raise BadRequest(f"\"{name}\" cannot be read as text: {err}", name) from None


def _integer(data: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = _optional_integer(data, key, low, high)
    return default if value is None else value


def _optional_integer(data: dict[str, Any], key: str, low: int, high: int) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRequest(f"\"{key}\" must be an integer in [{low}, {high}], got {_shown(value)}", key)
    return value


def _temperature(value: Any) -> float | None:
    """0..2; below GREEDY_BELOW (1e-5) it samples greedily (`power.runtime.sampling`)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 2.0:
        raise BadRequest(f"\"temperature\" must be a number in [0, 2], got {_shown(value)}", "temperature")
    return float(value)


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOP_STRINGS:
        raise BadRequest(f"\"stop\" must be a non-empty string or a list of at most {MAX_STOP_STRINGS} of them", "stop")
    return tuple(_text(s, "stop") for s in stops)


def _boolean(data: dict[str, Any], key: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise BadRequest(f"\"{key}\" must be true or false, got {_shown(value)}", key)
    return value


def _shown(value: Any) -> str:
    shown = json.dumps(value, ensure_ascii=True)
    return shown if len(shown) <= 40 else shown[:37] + "..."


# --- metrics -------------------------------------------------------------------------------------------------------


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
        self.position_reached = Counter("power_spec_position_reached", "Rounds that reached draft position N (accepted "
                                        "the drafts before it).", ["position"], registry=r)
        self.position_accepted = Counter("power_spec_position_accepted", "Rounds that accepted the draft at position N.",
                                         ["position"], registry=r)
        self.generated_tokens = Counter("power_generated_tokens", "Tokens emitted.", registry=r)
        self.prompt_tokens = Counter("power_prompt_tokens", "Prompt tokens of finished requests.", registry=r)
        self.reused_tokens = Counter("power_prompt_reused_tokens", "Prompt tokens taken from a slot's cache.", registry=r)
        self.requests = Counter("power_requests", "Completion requests by outcome.", ["status"], registry=r)
        self.unauthorized = Counter("power_unauthorized_requests", "Requests refused with 401, by the key they sent "
                                    "(missing or wrong).", ["key"], registry=r)
        self.decode_tok_s = Histogram("power_decode_tokens_per_second", "Per-request decode rate (tokens after the first).",
                                      buckets=DECODE_TOK_S_BUCKETS, registry=r)
        self.ttft = Histogram("power_time_to_first_token_seconds", "Arrival to the first streamed text, queue wait included.",
                              buckets=TTFT_S_BUCKETS, registry=r)
        self.queue_depth = Gauge("power_queue_depth", "Requests waiting for a slot.", registry=r)
        self.slots_busy = Gauge("power_slots_busy", "Slots holding a request.", registry=r)
        self.ready = Gauge("power_ready", "1 once the plan's model is loaded.", registry=r)

    def record_receipt(self, receipt: Receipt) -> None:
        self.drafts.inc(receipt.speculative_rounds)
        self.draft_tokens.inc(receipt.proposed)
        self.accepted_tokens.inc(receipt.accepted)
        self.replays.inc(receipt.replays)
        self.clamps.inc(receipt.clamps)
        self.fallbacks.inc(receipt.fallbacks)
        self.governor_parks.inc(receipt.governor_parks)
        for position, (reached, accepted) in enumerate(zip(receipt.position_reached, receipt.position_accepted,
                                                           strict=True), start=1):
            self.position_reached.labels(position=str(position)).inc(reached)
            self.position_accepted.labels(position=str(position)).inc(accepted)
        self.generated_tokens.inc(len(receipt.token_ids))
        self.prompt_tokens.inc(receipt.prompt_tokens)
        self.reused_tokens.inc(receipt.prompt_reused)
        if len(receipt.token_ids) > 1:
            self.decode_tok_s.observe(receipt.decode_tok_s)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


# --- the engine thread -------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What the engine thread hands back for one request."""

    receipt: Receipt  # its text is what the client was sent (cut before a stop string)
    finish_reason: str  # "stop" or "length"; a cancelled request has no finish reason


@dataclass(eq=False)
class Job:
    request: CompletionRequest
    prompt_ids: list[int]
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


# --- the app -----------------------------------------------------------------------------------------------------


@dataclass
class ServerState:
    model: str
    plan_digest: str | None
    limits: ServerLimits
    metrics: Metrics = field(default_factory=Metrics)
    worker: EngineWorker | None = None
    load_error: str | None = None
    template: ChatTemplate | None = None
    template_problem: str | None = None  # why there is no chat endpoint
    created: int = field(default_factory=lambda: int(time.time()))


def create_app(load_engine: Callable[[], Engine], model: str, plan_digest: str | None,
               limits: ServerLimits = ServerLimits(), on_load_failure: Callable[[str], None] | None = None,
               chat_template: ChatTemplate | None = None, access: Access = Access()) -> Starlette:
    """The ASGI app. The engine loads on a background thread at startup; /health answers 503 until it is ready.

    `chat_template`: the operator's template for /v1/chat/completions (compiled, its BOS/EOS text filled in from
    the model once it loads); None uses the model's own.
    """
    state = ServerState(model, plan_digest, limits)
    sandbox = chat_template.sandbox if chat_template is not None else TemplateSandbox()

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
        state.template, state.template_problem = _chat_template(engine, chat_template, sandbox)
        if state.template_problem:
            print(f"note: no chat endpoint: {state.template_problem}", file=sys.stderr)
        state.worker = EngineWorker(engine, state.metrics, limits.queue_size)
        state.metrics.ready.set(1)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        threading.Thread(target=load, name="power-load", daemon=True).start()
        yield
        if state.worker:
            state.worker.stop()
        sandbox.close()

    async def health(_request: Request) -> Response:
        if state.worker is not None and not state.worker.alive:  # a liveness probe restarts it
            return JSONResponse({"status": "error", "error": f"the engine stopped: {state.worker.failure}"},
                                status_code=503)
        if state.worker is not None:
            return JSONResponse({"status": "ok", "model": state.model, "plan_digest": state.plan_digest,
                                 "slots": state.worker.engine.slots})
        if state.load_error is not None:
            return JSONResponse({"status": "error", "error": state.load_error}, status_code=503)
        return JSONResponse({"status": "loading", "model": state.model}, status_code=503)

    async def metrics(_request: Request) -> Response:
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def models(_request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": state.model, "object": "model", "created": state.created, "owned_by": "power",
             "plan_digest": state.plan_digest}]})

    async def completions(request: Request) -> Response:
        return await _serve(request, state, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await _serve(request, state, chat=True)

    async def not_found(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException), "registered for HTTPException only"
        return _error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", "invalid_request_error")

    async def internal_error(_request: Request, exc: Exception) -> Response:
        state.metrics.requests.labels("error").inc()
        return _error(500, f"the server failed on this request ({type(exc).__name__}); it carries on", "server_error")

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: not_found, Exception: internal_error})
    if access.api_key is not None:
        app.add_middleware(_RequireKey, access=access, refused=state.metrics.unauthorized)
    return app


def _chat_template(engine: Engine, given: ChatTemplate | None,
                   sandbox: TemplateSandbox) -> tuple[ChatTemplate | None, str | None]:
    """The chat template the endpoint renders with, or why there is none."""
    tokenizer = engine.tokenizer
    bos, eos = tokenizer.token_text(tokenizer.bos_id), tokenizer.token_text(tokenizer.vocab.eos_id)
    if given is not None:
        return given.with_tokens(bos, eos), None
    if not engine.chat_template:
        return None, ("the model's GGUF carries no chat template (tokenizer.chat_template); start power serve with "
                      "--chat-template-file FILE, or use /v1/completions")
    try:
        return ChatTemplate.load(engine.chat_template, "the model's tokenizer.chat_template", bos, eos, sandbox), None
    except PowerError as err:
        return None, f"{err.finding.message}; {err.finding.hint}"


# --- one request -------------------------------------------------------------------------------------------------


async def _serve(request: Request, state: ServerState, chat: bool) -> Response:
    count, worker = state.metrics.requests, state.worker
    if worker is not None and not worker.alive:
        count.labels("unavailable").inc()
        return _error(503, f"the engine stopped ({worker.failure}); the server must be restarted", "unavailable")
    if worker is None:
        count.labels("unavailable").inc()
        if state.load_error is not None:
            return _error(503, f"the model failed to load: {state.load_error}", "unavailable")
        return _error(503, "the model is not loaded yet; poll GET /health until it answers 200", "unavailable")
    job_arrived = time.perf_counter()
    deadline = job_arrived + state.limits.request_timeout_s
    try:
        body = await asyncio.wait_for(_body(request, state.limits.max_body_bytes), state.limits.body_timeout_s)
    except asyncio.TimeoutError:
        count.labels("timeout").inc()
        return _error(408, f"the request body did not arrive within {state.limits.body_timeout_s:g} s",
                      "invalid_request_error", code="request_timeout")
    except ClientDisconnect:
        count.labels("cancelled").inc()
        return _error(499, "client disconnected", "cancelled")
    except TooLarge as err:
        count.labels("bad_request").inc()
        return _error(413, f"{err}; send a shorter prompt", "invalid_request_error", code="request_too_large")
    try:
        parsed, prompt_ids = await asyncio.wait_for(asyncio.to_thread(_prepare, worker.engine, state, body, chat, deadline),
                                                    max(0.0, deadline - time.perf_counter()))
    except BadRequest as err:
        count.labels("bad_request").inc()
        return _error(400, str(err), "invalid_request_error", err.param, err.code)
    except ContextOverflow as err:
        count.labels("bad_request").inc()
        return _error(400, err.finding.message, "invalid_request_error", "prompt", "context_length_exceeded")
    except PowerError as err:
        count.labels("bad_request").inc()
        return _error(400, err.finding.message, "invalid_request_error", "prompt")
    except asyncio.TimeoutError:
        count.labels("timeout").inc()
        return _error(504, _timeout_message(state), "timeout")
    job = Job(parsed, prompt_ids, asyncio.get_running_loop(), job_arrived)
    try:
        worker.submit(job)
    except QueueFull as err:
        count.labels("rejected").inc()
        return _error(429, str(err), "queue_full", headers={"Retry-After": str(err.retry_after_s)})
    shape = ChatShape(state.model) if chat else CompletionShape(state.model)
    if parsed.stream:
        return StreamingResponse(_stream(job, state, shape), media_type="text/event-stream")
    return await _collect(job, request, state, shape)


async def _body(request: Request, limit: int) -> bytes:
    """The body, refused as soon as it passes `limit` bytes (or when its Content-Length says it will)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _prepare(engine: Engine, state: ServerState, body: bytes, chat: bool,
             deadline: float) -> tuple[CompletionRequest, list[int]]:
    """Parse, render and tokenize (on a worker thread): the request and its prompt's token IDs."""
    if chat:
        # A prompt longer than this cannot fit the context whatever it tokenizes to (`Engine.encode`).
        max_chars = engine.n_ctx * engine.tokenizer.max_token_bytes
        parsed = parse_chat(body, engine.n_ctx, state.template, state.template_problem, max_chars,
                            engine.tokenizer.as_text, max(0.0, deadline - time.perf_counter()))
    else:
        parsed = parse_completion(body, engine.n_ctx, engine.tokenizer.as_text)
    return parsed, engine.encode(parsed.prompt, parsed.max_tokens, parsed.add_bos, deadline)


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away (after the body is read, the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _collect(job: Job, request: Request, state: ServerState, shape: ResponseShape) -> Response:
    deadline = job.arrived + state.limits.request_timeout_s
    count = state.metrics.requests
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        while True:
            event = asyncio.ensure_future(job.events.get())
            done, _ = await asyncio.wait({event, gone}, timeout=max(0.0, deadline - time.perf_counter()),
                                         return_when=asyncio.FIRST_COMPLETED)
            if event not in done:
                event.cancel()
                job.cancel.set()
                if gone in done:
                    count.labels("cancelled").inc()
                    return _error(499, "client disconnected", "cancelled")
                count.labels("timeout").inc()
                return _error(504, _timeout_message(state), "timeout")
            kind, payload = event.result()
            if kind == "error":
                status, message = payload
                count.labels("error" if status >= 500 else "bad_request").inc()
                return _error(status, message, "server_error" if status >= 500 else "invalid_request_error")
            if kind == "done":
                count.labels("ok").inc()
                return JSONResponse(shape.body(payload))
    finally:
        gone.cancel()


async def _stream(job: Job, state: ServerState, shape: ResponseShape) -> AsyncIterator[str]:
    deadline = job.arrived + state.limits.request_timeout_s
    finished = False
    try:
        opening = shape.opening()
        if opening is not None:
            yield _sse(opening)
        while True:
            try:
                kind, payload = await asyncio.wait_for(job.events.get(), max(0.0, deadline - time.perf_counter()))
            except asyncio.TimeoutError:
                kind, payload = "timeout", None
            if kind == "text":
                yield _sse(shape.chunk(payload))
                continue
            finished = True
            yield _sse(_last_event(kind, payload, job, state, shape))
            yield "data: [DONE]\n\n"
            return
    finally:
        if not finished:  # the client went away mid-stream: cancel, and the decoder rolls back its open round
            job.cancel.set()
            state.metrics.requests.labels("cancelled").inc()


def _last_event(kind: str, payload: Any, job: Job, state: ServerState, shape: ResponseShape) -> dict[str, Any]:
    """The stream's closing event (the finish reason, usage and receipt, a timeout or an error), counted by outcome."""
    count = state.metrics.requests
    if kind == "done":
        count.labels("ok").inc()
        return shape.closing(payload)
    if kind == "timeout":
        job.cancel.set()
        count.labels("timeout").inc()
        return _error_body(_timeout_message(state), "timeout")
    status, message = payload
    count.labels("error" if status >= 500 else "bad_request").inc()
    return _error_body(message, "server_error" if status >= 500 else "invalid_request_error")


# --- response shapes ---------------------------------------------------------------------------------------------


class ResponseShape:
    """How one endpoint writes its responses: a whole body, or a stream's opening, text chunks and closing chunk."""

    object_name = ""
    chunk_name = ""
    id_prefix = ""

    def __init__(self, model: str) -> None:
        self.identity = {"id": f"{self.id_prefix}-{uuid.uuid4().hex}", "created": int(time.time()), "model": model}

    def body(self, outcome: Outcome) -> dict[str, Any]:
        return self.identity | {"object": self.object_name, "choices": [self._choice(outcome)]} | _extras(outcome)

    def opening(self) -> dict[str, Any] | None:
        return None

    def chunk(self, text: str) -> dict[str, Any]:
        raise NotImplementedError

    def closing(self, outcome: Outcome) -> dict[str, Any]:
        raise NotImplementedError

    def _choice(self, outcome: Outcome) -> dict[str, Any]:
        raise NotImplementedError


class CompletionShape(ResponseShape):
    object_name = chunk_name = "text_completion"
    id_prefix = "cmpl"

    def chunk(self, text: str) -> dict[str, Any]:
        return self.identity | {"object": self.chunk_name,
                                "choices": [{"index": 0, "text": text, "finish_reason": None, "logprobs": None}]}

    def closing(self, outcome: Outcome) -> dict[str, Any]:
        body = self.body(outcome)
        body["choices"][0]["text"] = ""  # the text went out in the chunks before
        return body

    def _choice(self, outcome: Outcome) -> dict[str, Any]:
        return {"index": 0, "text": outcome.receipt.text, "finish_reason": outcome.finish_reason, "logprobs": None}


class ChatShape(ResponseShape):
    object_name, chunk_name = "chat.completion", "chat.completion.chunk"
    id_prefix = "chatcmpl"

    def opening(self) -> dict[str, Any]:
        return self._delta({"role": "assistant", "content": ""}, None)

    def chunk(self, text: str) -> dict[str, Any]:
        return self._delta({"content": text}, None)

    def closing(self, outcome: Outcome) -> dict[str, Any]:
        return self._delta({}, outcome.finish_reason) | _extras(outcome)

    def _delta(self, delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        return self.identity | {"object": self.chunk_name,
                                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason,
                                             "logprobs": None}]}

    def _choice(self, outcome: Outcome) -> dict[str, Any]:
        return {"index": 0, "message": {"role": "assistant", "content": outcome.receipt.text},
                "finish_reason": outcome.finish_reason, "logprobs": None}


def _extras(outcome: Outcome) -> dict[str, Any]:
    """What every finished response carries besides its choices: usage, llama.cpp-style timings, the receipt."""
    receipt = outcome.receipt
    return {
        "usage": {"prompt_tokens": receipt.prompt_tokens, "completion_tokens": len(receipt.token_ids),
                  "total_tokens": receipt.prompt_tokens + len(receipt.token_ids),
                  "prompt_tokens_details": {"cached_tokens": receipt.prompt_reused}},
        "timings": timings(receipt),
        "receipt": receipt.published().document(),
    }


def timings(receipt: Receipt) -> dict[str, Any]:
    """llama.cpp-style per-request timings, so clients that read those read ours."""
    return {
        "cache_n": receipt.prompt_reused,
        "prompt_n": receipt.prompt_tokens - receipt.prompt_reused, "prompt_ms": receipt.prefill_s * 1e3,
        "prompt_per_second": receipt.prefill_tok_s,
        "predicted_n": len(receipt.token_ids), "predicted_ms": receipt.decode_s * 1e3,
        "predicted_per_second": receipt.decode_tok_s,
        "draft_n": receipt.proposed, "draft_n_accepted": receipt.accepted, "tokens_sha256": receipt.tokens_sha256,
    }


def _timeout_message(state: ServerState) -> str:
    return f"the request took longer than {state.limits.request_timeout_s:g} s and was cancelled; raise --timeout or lower max_tokens"


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def _error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _error(status: int, message: str, kind: str, param: str | None = None, code: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(_error_body(message, kind, param, code), status_code=status, headers=headers)
