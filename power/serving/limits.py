"""What the server bounds on each connection and request: queue, timeouts, body size, and a deadline for the
headers that uvicorn does not keep."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import h11
from starlette.requests import Request
from uvicorn.protocols.http.h11_impl import H11Protocol

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


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



class TooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is larger than {limit} bytes")
        self.limit = limit



async def read_body(request: Request, limit: int) -> bytes:
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

