"""Chat messages -> a prompt, through the model's own chat template (the GGUF's `tokenizer.chat_template`).

The template is rendered as transformers and llama.cpp render it: Jinja2's
immutable sandbox (a template is data from a model file, so it reaches no Python
object it is not handed and changes nothing it is handed), `trim_blocks` and
`lstrip_blocks`, `raise_exception(message)` for the template's own refusals,
`strftime_now(format)`, the BOS and EOS tokens as `bos_token` / `eos_token`
text, and `add_generation_prompt=True` so the prompt ends where the assistant's
turn begins. An operator may give a template file instead (`power serve
--chat-template-file`), as llama-server's `--chat-template-file`; a model that
carries none and was given none has no chat endpoint (never a guessed format).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

from jinja2 import Template, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from power.runtime.errors import RuntimeInputError


class ChatTemplateError(RuntimeInputError):
    """A template that does not compile, or that refuses the messages it was given (`raise_exception`)."""

    code = "PWR605"


class _Refusal(Exception):
    """What `raise_exception` raises inside a template: the template's own message."""


def _raise_exception(message: str) -> None:
    raise _Refusal(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@dataclass(frozen=True)
class ChatTemplate:
    source: str
    origin: str  # where the template came from, for messages ("the model's tokenizer.chat_template", a file)
    bos_token: str
    eos_token: str

    @classmethod
    def load(cls, source: str, origin: str, bos_token: str, eos_token: str) -> ChatTemplate:
        template = cls(source, origin, bos_token, eos_token)
        template._template  # noqa: B018 - a template that does not compile is refused when the server loads, not per request
        return template

    @classmethod
    def from_file(cls, path: Path, bos_token: str, eos_token: str) -> ChatTemplate:
        try:
            source = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ChatTemplateError(f"the chat template file cannot be read ({err})", file=str(path),
                                    hint="give a UTF-8 Jinja template file") from None
        return cls.load(source, str(path), bos_token, eos_token)

    def render(self, messages: Sequence[dict[str, Any]]) -> str:
        """The prompt for `messages` ({"role", "content"} dicts), ending with the assistant's turn opened."""
        try:
            return self._template.render(messages=list(messages), bos_token=self.bos_token,
                                           eos_token=self.eos_token, add_generation_prompt=True)
        except _Refusal as refusal:
            raise ChatTemplateError(f"the chat template refused these messages: {refusal}",
                                    hint="send messages in the roles and order the model's template accepts") from None
        except TemplateError as err:
            raise ChatTemplateError(f"the chat template from {self.origin} failed on these messages: {err}",
                                    hint="send plain-text messages, or serve with --chat-template-file") from None

    @cached_property
    def _template(self) -> Template:
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
        try:
            return environment.from_string(self.source)
        except TemplateError as err:
            raise ChatTemplateError(f"the chat template from {self.origin} does not compile: {err}",
                                    hint="serve with --chat-template-file naming a template that compiles") from None
