"""Chat messages -> a prompt, through the model's own chat template (the GGUF's `tokenizer.chat_template`).

The template is rendered as transformers and llama.cpp render it: Jinja2's
immutable sandbox (a template is data from a model file, so it reaches no Python
object it is not handed and changes nothing it is handed), `trim_blocks` and
`lstrip_blocks`, `raise_exception(message)` for the template's own refusals,
`strftime_now(format)`, the BOS and EOS tokens as `bos_token` / `eos_token`
text, and `add_generation_prompt=True` so the prompt ends where the assistant's
turn begins. Compiling and rendering run in a child process bounded in time,
memory and output (`power.runtime.template_sandbox`). An operator may give a
template file instead (`power serve --chat-template-file`), as llama-server's
`--chat-template-file`, read with the project's bounded reader; a model that
carries none and was given none has no chat endpoint (never a guessed format).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from power.artifacts.bounded_reader import DocumentError, read_text
from power.runtime.template_sandbox import ChatTemplateError, TemplateSandbox

__all__ = ["MAX_TEMPLATE_BYTES", "ChatTemplate", "ChatTemplateError"]

MAX_TEMPLATE_BYTES = 1 << 20  # llama.cpp's largest bundled templates are a few KiB


@dataclass(frozen=True)
class ChatTemplate:
    source: str
    origin: str  # where the template came from, for messages ("the model's tokenizer.chat_template", a file)
    bos_token: str
    eos_token: str
    sandbox: TemplateSandbox = field(compare=False, repr=False)

    @classmethod
    def load(cls, source: str, origin: str, bos_token: str, eos_token: str, sandbox: TemplateSandbox) -> ChatTemplate:
        """The template, compiled once now: one that does not compile is refused when the server starts."""
        sandbox.compile(source, origin)
        return cls(source, origin, bos_token, eos_token, sandbox)

    @staticmethod
    def read_file(path: Path) -> str:
        """A template file's text: a regular UTF-8 file of at most MAX_TEMPLATE_BYTES (no FIFO, no device)."""
        try:
            return read_text(path, MAX_TEMPLATE_BYTES)
        except DocumentError as err:
            raise ChatTemplateError("the chat template file cannot be used: it "
                                    f"{err.message.removeprefix('cannot read: ')}", file=str(path),
                                    hint="give a UTF-8 Jinja template file") from None

    def with_tokens(self, bos_token: str, eos_token: str) -> ChatTemplate:
        return ChatTemplate(self.source, self.origin, bos_token, eos_token, self.sandbox)

    def render(self, messages: Sequence[dict[str, Any]], max_chars: int, budget_s: float | None = None) -> str:
        """The prompt for `messages` ({"role", "content"} dicts), ending with the assistant's turn opened; at most
        `max_chars` characters, within `budget_s` seconds (and the sandbox's own budget)."""
        variables = {"messages": list(messages), "bos_token": self.bos_token, "eos_token": self.eos_token,
                     "add_generation_prompt": True}
        return self.sandbox.render(self.source, self.origin, variables, max_chars, budget_s)
