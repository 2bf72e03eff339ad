"""`power serve`: OpenAI-compatible completions and chat over one engine, with /health and Prometheus /metrics.

One model, one engine thread (`worker`). The engine decodes up to the plan's `slots`
requests side by side (`power.runtime.decoder`); more wait in a bounded queue
(full: 429 with Retry-After) and take slots in arrival order as they free. The
HTTP side is starlette on uvicorn (`server.create_app`, `routes`); the engine
thread talks to a request's handler through an asyncio queue fed with
`call_soon_threadsafe`.

The event loop never does a request's heavy work: a body is read up to a size
limit (413 past it; `limits`), and parsing (`requests`), chat-template rendering
and tokenizing run on a worker thread, under the request's timeout, after a
length check that needs no tokenizer. Faults stay inside their request: bad input
is a 400 naming the field, an exception while generating is that request's 500
and the others go on, and any other failure is still a JSON error in OpenAI's
shape (`responses`), counted (`metrics`). A client that disconnects (noticed at
once, streaming or not), or a request past its timeout, sets the request's cancel
event, and the decoder restores its last committed transaction at the next round
boundary. A stop string is a normal end. With an API key, `access` refuses a
request without it before any route runs.
"""
