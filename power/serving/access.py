"""Who may call the server: the API-key check, answered 401 in OpenAI's shape before any route runs."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from power.serving.responses import error_response


@dataclass(frozen=True)
class Access:
    """Who may call the server: with an `api_key`, every route but /health (and /metrics when `public_metrics`)
    needs `Authorization: Bearer <key>`, as OpenAI's API and llama-server's --api-key do."""

    api_key: str | None = None
    public_metrics: bool = False

    def open_paths(self) -> frozenset[str]:
        return frozenset({"/health", "/metrics"} if self.public_metrics else {"/health"})


class RequireKey:
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
                response = error_response(401, message, "invalid_request_error", code="invalid_api_key",
                                  headers={"WWW-Authenticate": "Bearer"})
                self.refused.labels("wrong" if given else "missing").inc()
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

