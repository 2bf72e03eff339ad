"""Chat templates compiled and rendered in a child process under hard limits: time, memory and output size.

A chat template is data from a file the operator did not write (a GGUF's
`tokenizer.chat_template`, a `--chat-template-file`). Jinja's sandbox keeps it
away from Python objects, but not from the CPU or memory: `{{ 9 ** 9 ** 9 }}`
holds the interpreter (and its lock) in one C call, `range` loops nest,
`'{:>999999999}'.format(1)` allocates a gigabyte, and Jinja folds constant
expressions while it compiles. In-process, any of them freezes the event loop,
the engine and even SIGTERM. So compiling and rendering happen here, in a child:

- **time**: the parent waits `budget_s` for each answer, then kills the child
  (SIGKILL) and starts a fresh one for the next request; the child also arms a
  real-time timer whose default action ends it, so it dies on its own even if the
  parent is gone;
- **memory**: the child's address space is capped (`RLIMIT_AS`); an allocation past
  it is a `MemoryError`, answered as the template's failure;
- **output**: rendering stops as soon as the text passes the caller's limit (the
  characters the context could hold).

Requests are serialized (one child, a lock): a well-behaved template renders in
well under a millisecond, a hostile one costs the others at most `budget_s`.
Frames are a 4-byte big-endian length and UTF-8 JSON, both ways.
"""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import sys
import threading
import time
from datetime import datetime
from typing import IO, Any

from power.runtime.errors import RuntimeInputError

RENDER_BUDGET_S = 2.0
CHILD_MEMORY_BYTES = 512 << 20
MAX_FRAME_BYTES = 64 << 20
_LENGTH = struct.Struct(">I")


class ChatTemplateError(RuntimeInputError):
    """A template that does not compile, refuses its messages, or runs past its budget."""

    code = "PWR605"


class TemplateSandbox:
    """The parent's side: one child process, started on first use and replaced after it is killed."""

    def __init__(self, budget_s: float = RENDER_BUDGET_S, memory_bytes: int = CHILD_MEMORY_BYTES) -> None:
        self.budget_s, self.memory_bytes = budget_s, memory_bytes
        self._lock = threading.Lock()
        self._child: subprocess.Popen[bytes] | None = None

    def compile(self, source: str, origin: str) -> None:
        """ChatTemplateError when `source` does not compile (or its compilation runs past the budget)."""
        reply = self._ask({"op": "compile", "source": source}, self.budget_s, origin)
        if "error" in reply:
            raise ChatTemplateError(f"the chat template from {origin} does not compile: {reply['error']}",
                                    hint="serve with --chat-template-file naming a template that compiles")

    def render(self, source: str, origin: str, variables: dict[str, Any], max_chars: int,
               budget_s: float | None = None) -> str:
        """The rendered text; ChatTemplateError when the template refuses, fails or passes a limit."""
        budget = self.budget_s if budget_s is None else min(budget_s, self.budget_s)
        reply = self._ask({"op": "render", "source": source, "variables": variables, "max_chars": max_chars},
                          budget, origin)
        if "refused" in reply:
            raise ChatTemplateError(f"the chat template refused these messages: {reply['refused']}",
                                    hint="send messages in the roles and order the model's template accepts")
        if "error" in reply:
            raise ChatTemplateError(f"the chat template from {origin} failed on these messages: {reply['error']}",
                                    hint="send plain-text messages, or serve with --chat-template-file")
        return str(reply["text"])

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _ask(self, request: dict[str, Any], budget_s: float, origin: str) -> dict[str, Any]:
        frame = json.dumps(request | {"budget_s": budget_s}).encode("utf-8")
        with self._lock:
            child = self._started()
            try:
                _write_frame(child.stdin, frame)
                reply = _read_frame(child.stdout, time.monotonic() + budget_s)
            except TimeoutError:
                self._stop()
                raise ChatTemplateError(f"the chat template from {origin} ran past its budget of {budget_s:g} s "
                                        "and was stopped", hint="use a template that renders these messages "
                                        "quickly (llama.cpp's templates take microseconds)") from None
            except (OSError, EOFError, ValueError):
                self._stop()
                raise ChatTemplateError(f"the chat template from {origin} was stopped: it ran out of its "
                                        f"{self.memory_bytes >> 20} MiB or its time", hint="use a template that "
                                        "renders these messages within those limits") from None
        return dict(json.loads(reply))

    def _started(self) -> subprocess.Popen[bytes]:
        if self._child is None or self._child.poll() is not None:
            # -P: the working directory is not on the child's import path (it could hold a `power` folder).
            self._child = subprocess.Popen([sys.executable, "-P", "-m", __name__, str(self.memory_bytes)],
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        return self._child

    def _stop(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child.wait()
            for pipe in (self._child.stdin, self._child.stdout):
                if pipe is not None:
                    pipe.close()
            self._child = None


def _write_frame(pipe: IO[bytes] | None, payload: bytes) -> None:
    assert pipe is not None, "the child is started with pipes"
    pipe.write(_LENGTH.pack(len(payload)) + payload)
    pipe.flush()


def _read_frame(pipe: IO[bytes] | None, deadline: float) -> bytes:
    """One frame, or TimeoutError at `deadline`, EOFError when the child died."""
    assert pipe is not None, "the child is started with pipes"
    fd, data = pipe.fileno(), bytearray()
    need = _LENGTH.size
    while len(data) < need:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError
        piece = os.read(fd, need - len(data))
        if not piece:
            raise EOFError
        data += piece
        if need == _LENGTH.size and len(data) == need:
            (length,) = _LENGTH.unpack(data)
            if length > MAX_FRAME_BYTES:
                raise ValueError("frame too large")
            need += length
    return bytes(data[_LENGTH.size:])


# --- the child ---------------------------------------------------------------------------------------------------


class _Refusal(Exception):
    """What `raise_exception` raises inside a template: the template's own message."""


def _raise_exception(message: str) -> None:
    raise _Refusal(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _child(memory_bytes: int) -> None:
    import resource
    import signal

    from jinja2 import Template
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # its default action ends the process, whatever Python is doing
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    compiled: dict[str, Template] = {}
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while header := stdin.read(_LENGTH.size):
        (length,) = _LENGTH.unpack(header)
        request = json.loads(stdin.read(length))
        signal.setitimer(signal.ITIMER_REAL, float(request["budget_s"]) + 1.0)
        reply = _answer(request, environment, compiled)
        signal.setitimer(signal.ITIMER_REAL, 0)
        _write_frame(stdout, json.dumps(reply).encode("utf-8"))


def _answer(request: dict[str, Any], environment: Any, compiled: dict[str, Any]) -> dict[str, Any]:
    try:
        source = request["source"]
        if source not in compiled:
            compiled.clear()  # a server renders one template; keep only the latest
            compiled[source] = environment.from_string(source)
        if request["op"] == "compile":
            return {"ok": True}
        return {"text": _render(compiled[source], request["variables"], int(request["max_chars"]))}
    except _Refusal as refusal:
        return {"refused": str(refusal)}
    except MemoryError:
        return {"error": "it needs more memory than a template may use"}
    except RecursionError:
        return {"error": "it nests too deeply"}
    except Exception as err:  # noqa: BLE001 - any failure of the template is its answer, never the child's death
        return {"error": f"{type(err).__name__}: {err}"}


def _render(template: Any, variables: dict[str, Any], max_chars: int) -> str:
    pieces, size = [], 0
    for piece in template.generate(**variables):
        size += len(piece)
        if size > max_chars:
            raise ValueError(f"its output passes {max_chars:,} characters (more than the context can hold)")
        pieces.append(piece)
    return "".join(pieces)


if __name__ == "__main__":
    _child(int(sys.argv[1]))
