"""What the routes read: the model's name, the limits and metrics, and the engine's worker once it has loaded
(or why it did not), with the chat template the chat endpoint renders with."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from power.findings import PowerError
from power.runtime.chat import ChatTemplate
from power.runtime.engine import Engine
from power.runtime.template_sandbox import TemplateSandbox
from power.serving.limits import ServerLimits
from power.serving.metrics import Metrics
from power.serving.worker import EngineWorker


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

    def load(self, load_engine: Callable[[], Engine], chat_template: ChatTemplate | None, sandbox: TemplateSandbox,
             on_load_failure: Callable[[str], None] | None) -> None:
        """Load the engine (on the server's loading thread) and start its worker; a failure is kept for /health and
        told to the operator, never a dead thread."""
        try:
            engine = load_engine()
        except Exception as err:  # noqa: BLE001 - reported on /health and to the operator, never a dead thread
            if isinstance(err, PowerError):
                self.load_error = err.finding.message
                print(f"the model did not load:\n{err.finding.render()}", file=sys.stderr)
            else:
                self.load_error = f"{type(err).__name__}: {err}"
                print(f"error: the model did not load: {self.load_error}", file=sys.stderr)
            if on_load_failure:
                on_load_failure(self.load_error)
            return
        self.template, self.template_problem = _chat_template(engine, chat_template, sandbox)
        if self.template_problem:
            print(f"note: no chat endpoint: {self.template_problem}", file=sys.stderr)
        self.worker = EngineWorker(engine, self.metrics, self.limits.queue_size)
        self.metrics.ready.set(1)


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

