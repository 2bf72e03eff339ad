"""Response shapes in OpenAI's format: a completion or chat body, a stream's events, and errors."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse

from power.documents.receipt import Receipt


@dataclass
class Outcome:
    """What the engine thread hands back for one request."""

    receipt: Receipt  # its text is what the client was sent (cut before a stop string)
    finish_reason: str  # "stop" or "length"; a cancelled request has no finish reason


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



def sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(status: int, message: str, kind: str, param: str | None = None, code: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, kind, param, code), status_code=status, headers=headers)
