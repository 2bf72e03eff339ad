"""Stop strings: a request's text ends before the first one, its tokens with the one that completed it.

Stop strings are matched on the decoded text (as OpenAI and llama.cpp do).
Text goes out held back just enough never to emit part of a stop string, and
the stop string itself is not sent. The token that completed it is the
request's last token, like an end-of-sequence token, which is in the token
IDs but not in the text. Tokens that a round decoded past it are dropped, so a
speculative run and a plain run of the same request record the same tokens
however many tokens their last rounds emitted.
"""

from __future__ import annotations

from typing import Sequence

from .tokenizer import StreamDecoder


class StopText:
    """One request's text from its token IDs as they land, cut before the first stop string."""

    def __init__(self, stream: StreamDecoder, stops: Sequence[str] = ()) -> None:
        self._stream = stream
        self._stops = tuple(stops)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._pending = ""
        self.hit = False  # a stop string was completed
        self.tokens = 0  # tokens taken; after a hit, the last one completed the stop string

    def feed(self, token_ids: Sequence[int]) -> str:
        """The text that is safe to emit after these tokens; once a stop string is complete no token is taken."""
        for token in token_ids:
            if self.hit:
                break
            self.tokens += 1
            self._pending += self._stream.feed(token)
            self.hit = self._cut_at_stop()
        return self._release(everything=self.hit)

    def flush(self) -> str:
        """The rest of the text at the end of the request."""
        if not self.hit:
            self._pending += self._stream.flush()
            self.hit = self._cut_at_stop()
        return self._release(everything=True)

    def _cut_at_stop(self) -> bool:
        found = [at for at in (self._pending.find(stop) for stop in self._stops) if at >= 0]
        if found:
            self._pending = self._pending[: min(found)]
        return bool(found)

    def _release(self, everything: bool) -> str:
        cut = len(self._pending) if everything else max(0, len(self._pending) - self._hold)
        safe, self._pending = self._pending[:cut], self._pending[cut:]
        return safe
