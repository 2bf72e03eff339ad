"""OpenAI request bodies: /v1/completions and /v1/chat/completions validated into a `CompletionRequest`, each
refusal a `BadRequest` naming the field and what is allowed."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from power.findings import PowerError
from power.runtime.chat import ChatTemplate

ClientText = Callable[[str], str]  # a client's text as the model reads it (`Tokenizer.as_text`)

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_STOP_STRINGS = 4
CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")


class BadRequest(ValueError):
    """A request the server refuses with 400: the message says which field (`param`) and what is allowed."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.code = param, code



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

