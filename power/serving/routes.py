"""The routes: /health, /metrics, /v1/models, and one completion request from its body to its last byte."""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from power.findings import PowerError
from power.runtime.engine import Engine
from power.runtime.errors import ContextOverflow
from power.serving.limits import TooLarge, read_body
from power.serving.requests import BadRequest, CompletionRequest, parse_chat, parse_completion
from power.serving.responses import ChatShape, CompletionShape, ResponseShape, error_body, error_response, sse
from power.serving.state import ServerState
from power.serving.worker import Job, QueueFull


def routes(state: ServerState) -> list[Route]:
    """The endpoints, each reading `state`."""

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

    return [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    ]


def exception_handlers(state: ServerState) -> dict[Any, Any]:
    """An unknown route and any failure outside a request's own handling, answered in OpenAI's error shape."""

    async def not_found(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException), "registered for HTTPException only"
        return error_response(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                              "invalid_request_error")

    async def internal_error(_request: Request, exc: Exception) -> Response:
        state.metrics.requests.labels("error").inc()
        return error_response(500, f"the server failed on this request ({type(exc).__name__}); it carries on",
                              "server_error")

    return {HTTPException: not_found, Exception: internal_error}


async def _serve(request: Request, state: ServerState, chat: bool) -> Response:
    count, worker = state.metrics.requests, state.worker
    if worker is not None and not worker.alive:
        count.labels("unavailable").inc()
        return error_response(503, f"the engine stopped ({worker.failure}); the server must be restarted",
                              "unavailable")
    if worker is None:
        count.labels("unavailable").inc()
        if state.load_error is not None:
            return error_response(503, f"the model failed to load: {state.load_error}", "unavailable")
        return error_response(503, "the model is not loaded yet; poll GET /health until it answers 200", "unavailable")
    job_arrived = time.perf_counter()
    deadline = job_arrived + state.limits.request_timeout_s
    try:
        body = await asyncio.wait_for(read_body(request, state.limits.max_body_bytes), state.limits.body_timeout_s)
    except asyncio.TimeoutError:
        count.labels("timeout").inc()
        return error_response(408, f"the request body did not arrive within {state.limits.body_timeout_s:g} s",
                      "invalid_request_error", code="request_timeout")
    except ClientDisconnect:
        count.labels("cancelled").inc()
        return error_response(499, "client disconnected", "cancelled")
    except TooLarge as err:
        count.labels("bad_request").inc()
        return error_response(413, f"{err}; send a shorter prompt", "invalid_request_error", code="request_too_large")
    try:
        parsed, prompt_ids = await asyncio.wait_for(asyncio.to_thread(_prepare, worker.engine, state, body, chat,
                                                                      deadline),
                                                    max(0.0, deadline - time.perf_counter()))
    except BadRequest as err:
        count.labels("bad_request").inc()
        return error_response(400, str(err), "invalid_request_error", err.param, err.code)
    except ContextOverflow as err:
        count.labels("bad_request").inc()
        return error_response(400, err.finding.message, "invalid_request_error", "prompt", "context_length_exceeded")
    except PowerError as err:
        count.labels("bad_request").inc()
        return error_response(400, err.finding.message, "invalid_request_error", "prompt")
    except asyncio.TimeoutError:
        count.labels("timeout").inc()
        return error_response(504, _timeout_message(state), "timeout")
    job = Job(parsed, prompt_ids, asyncio.get_running_loop(), job_arrived)
    try:
        worker.submit(job)
    except QueueFull as err:
        count.labels("rejected").inc()
        return error_response(429, str(err), "queue_full", headers={"Retry-After": str(err.retry_after_s)})
    shape = ChatShape(state.model) if chat else CompletionShape(state.model)
    if parsed.stream:
        return StreamingResponse(_stream(job, state, shape), media_type="text/event-stream")
    return await _collect(job, request, state, shape)



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
                    return error_response(499, "client disconnected", "cancelled")
                count.labels("timeout").inc()
                return error_response(504, _timeout_message(state), "timeout")
            kind, payload = event.result()
            if kind == "error":
                status, message = payload
                count.labels("error" if status >= 500 else "bad_request").inc()
                return error_response(status, message, "server_error" if status >= 500 else "invalid_request_error")
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
            yield sse(opening)
        while True:
            try:
                kind, payload = await asyncio.wait_for(job.events.get(), max(0.0, deadline - time.perf_counter()))
            except asyncio.TimeoutError:
                kind, payload = "timeout", None
            if kind == "text":
                yield sse(shape.chunk(payload))
                continue
            finished = True
            yield sse(_last_event(kind, payload, job, state, shape))
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
        return error_body(_timeout_message(state), "timeout")
    status, message = payload
    count.labels("error" if status >= 500 else "bad_request").inc()
    return error_body(message, "server_error" if status >= 500 else "invalid_request_error")



def _timeout_message(state: ServerState) -> str:
    return (f"the request took longer than {state.limits.request_timeout_s:g} s and was cancelled; "
            "raise --timeout or lower max_tokens")
