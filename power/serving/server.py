"""`create_app`: the ASGI app, glued from the serving modules (`power.serving`)."""

from __future__ import annotations

import threading
from contextlib import asynccontextmanager
from functools import partial
from typing import AsyncIterator, Callable

from starlette.applications import Starlette

from power.runtime.chat import ChatTemplate
from power.runtime.engine import Engine
from power.runtime.template_sandbox import TemplateSandbox
from power.serving.access import Access, RequireKey
from power.serving.limits import ServerLimits
from power.serving.routes import exception_handlers, routes
from power.serving.state import ServerState


def create_app(load_engine: Callable[[], Engine], model: str, plan_digest: str | None,
               limits: ServerLimits = ServerLimits(), on_load_failure: Callable[[str], None] | None = None,
               chat_template: ChatTemplate | None = None, access: Access = Access()) -> Starlette:
    """The ASGI app. The engine loads on a background thread at startup; /health answers 503 until it is ready.

    `chat_template`: the operator's template for /v1/chat/completions (compiled, its BOS/EOS text filled in from
    the model once it loads); None uses the model's own.
    """
    state = ServerState(model, plan_digest, limits)
    sandbox = chat_template.sandbox if chat_template is not None else TemplateSandbox()
    load = partial(state.load, load_engine, chat_template, sandbox, on_load_failure)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        threading.Thread(target=load, name="power-load", daemon=True).start()
        yield
        if state.worker:
            state.worker.stop()
        sandbox.close()

    app = Starlette(routes=routes(state), lifespan=lifespan, exception_handlers=exception_handlers(state))
    if access.api_key is not None:
        app.add_middleware(RequireKey, access=access, refused=state.metrics.unauthorized)
    return app
