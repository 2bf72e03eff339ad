"""Bounded reading of the text documents Power reads: TOML files, plans, fleet locks, evidence, env files, units.

One reader for all of them, so none can hang or exhaust memory: the path must
be a regular file (a FIFO would block forever, `/dev/zero` never ends), at
most `limit` bytes are read, the bytes must be UTF-8, and JSON and TOML are
parsed with guards: nesting at most `MAX_DEPTH` deep, integers within 64 bits
(TOML's own range; Python would otherwise raise on 4,300 digits), no NaN or
infinite JSON numbers. Every failure is a `DocumentError` whose `reason` lets
each caller report it under its own finding code, at the line and column
where the document went wrong when there is one.
"""

from __future__ import annotations

import enum
import json
import math
import os
import re
import stat
from typing import Any

from power.findings import Finding, Severity

# Every size bound a reader uses; docs/security.md lists them.
MAX_TOML_BYTES = 8 << 20
MAX_JSON_BYTES = 64 << 20
MAX_LAUNCH_BYTES = 1 << 20
# No Power document nests deeper than about ten levels.
MAX_DEPTH = 64
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# A signed 64-bit integer has at most 19 digits; a longer run is refused before int() sees it.
_MAX_INT_CHARACTERS = 20
_LONG_INTEGER = re.compile(r"[+-]?\d[\d_]{4299,}")


class Reason(enum.Enum):
    MISSING = "missing"
    NOT_REGULAR = "not a regular file"
    UNREADABLE = "unreadable"
    TOO_LARGE = "too large"
    NOT_UTF8 = "not UTF-8"
    SYNTAX = "syntax"
    TOO_DEEP = "nested too deeply"
    NUMBER = "number out of range"


class DocumentError(Exception):
    """Why a document cannot be read, and where in it (1-based line and column, or a key path) when known."""

    def __init__(self, reason: Reason, message: str, *, line: int | None = None, col: int | None = None,
                 source_line: str | None = None, where: tuple[str | int, ...] | None = None) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message
        self.line, self.col, self.source_line, self.where = line, col, source_line, where

    def finding(self, code: str, path: str | os.PathLike[str], hint: str, what: str | None = None) -> Finding:
        """This failure as a finding under the reader's own code; `what` names the document in the message."""
        message = f"cannot read {what}: {self.message}" if what else self.message
        return Finding(code=code, severity=Severity.ERROR, message=message, file=str(path), line=self.line,
                       col=self.col, hint=hint, source_line=self.source_line)


def lookup_problem(path: str | os.PathLike[str]) -> str | None:
    """None when `path` can be looked up; else why not, as the rest of a sentence about it ("does not exist", or
    "cannot be looked up (File name too long)"): a name the system refuses is a reason, never an exception."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return "does not exist"
    except (OSError, ValueError) as err:
        return f"cannot be looked up ({getattr(err, 'strerror', None) or err})"
    return None


def is_regular_file(path: str | os.PathLike[str]) -> bool:
    """`path` names a regular file (False, not an exception, for a name the system refuses)."""
    return lookup_problem(path) is None and stat.S_ISREG(os.stat(path).st_mode)


def open_regular(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    """A read-only descriptor of `path` and its stat, if it is a regular file.

    Checked before opening (opening a device or FIFO can block or have effects), and again
    on the descriptor, opened non-blocking, in case the path was swapped in between.
    """
    if not stat.S_ISREG((before := _attempt(os.stat, path)).st_mode):
        raise _not_regular(before.st_mode)
    fd = _attempt(lambda p: os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), path)
    opened = os.fstat(fd)
    if not stat.S_ISREG(opened.st_mode):
        os.close(fd)
        raise _not_regular(opened.st_mode)
    return fd, opened


def read_bytes(path: str | os.PathLike[str], limit: int) -> bytes:
    """The file's bytes, if it is a regular file of at most `limit` bytes."""
    fd, info = open_regular(path)
    try:
        if info.st_size > limit:
            raise DocumentError(Reason.TOO_LARGE, f"is {info.st_size:,} bytes; this file may have at most "
                                f"{limit:,} bytes ({_size(limit)})")
        with os.fdopen(os.dup(fd), "rb") as handle:
            raw = handle.read(limit + 1)
    except OSError as err:
        raise DocumentError(Reason.UNREADABLE, f"cannot read: {err.strerror or err}") from None
    finally:
        os.close(fd)
    if len(raw) > limit:
        raise DocumentError(Reason.TOO_LARGE, f"grew past the {limit:,} bytes ({_size(limit)}) this file may have "
                            "while it was read")
    return raw


def _attempt(call, path):
    try:
        return call(path)
    except FileNotFoundError:
        raise DocumentError(Reason.MISSING, "no such file or directory") from None
    except (OSError, ValueError) as err:
        raise DocumentError(Reason.UNREADABLE, f"cannot read: {getattr(err, 'strerror', None) or err}") from None


def _not_regular(mode: int) -> DocumentError:
    return DocumentError(Reason.NOT_REGULAR, f"is {_kind(mode)}, not a regular file")


def decode_utf8(raw: bytes) -> str:
    """The bytes as text; invalid UTF-8 is located at its line and column."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line, col, source = byte_position(raw, err.start)
        raise DocumentError(Reason.NOT_UTF8, f"byte 0x{raw[err.start]:02x} at offset {err.start} is not valid UTF-8",
                            line=line, col=col, source_line=source) from None


def read_text(path: str | os.PathLike[str], limit: int) -> str:
    return decode_utf8(read_bytes(path, limit))


def read_json(path: str | os.PathLike[str], limit: int = MAX_JSON_BYTES) -> Any:
    return parse_json(read_text(path, limit))


def parse_json(text: str) -> Any:
    """JSON with 64-bit integers, finite numbers and at most MAX_DEPTH levels of nesting."""
    try:
        data = json.loads(text, parse_int=_json_int(text), parse_float=_json_float, parse_constant=_json_constant,
                          object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as err:
        raise DocumentError(Reason.SYNTAX, f"not valid JSON: {err.msg}", line=err.lineno, col=err.colno,
                            source_line=_source_line(text, err.lineno)) from None
    except RecursionError:
        raise DocumentError(Reason.TOO_DEEP, f"nests arrays or objects more than {MAX_DEPTH} levels deep") from None
    check_structure(data)
    return data


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are unique: JSON parsers disagree on which of two equal keys wins, so a document that
    repeats one (an edit that hides a second value behind the first) is refused."""
    data = dict(pairs)
    if len(data) != len(pairs):
        repeated = next(key for index, (key, _) in enumerate(pairs) if key in dict(pairs[:index]))
        raise DocumentError(Reason.SYNTAX,
                            f"not valid here: the key {json.dumps(repeated)} appears twice in one object")
    return data


def parse_toml(text: str) -> dict[str, Any]:
    """TOML (tomli), with integers held to TOML's 64-bit range and nesting to MAX_DEPTH levels."""
    import tomli  # here, not at the top: `power inspect` reads this module and no TOML (start-up time)

    try:
        data = tomli.loads(text)
    except tomli.TOMLDecodeError as err:
        raise DocumentError(Reason.SYNTAX, f"TOML syntax: {err.msg[:1].lower()}{err.msg[1:]}", line=err.lineno,
                            col=err.colno, source_line=_source_line(text, err.lineno)) from None
    except RecursionError:
        raise DocumentError(Reason.TOO_DEEP, "nests arrays or inline tables too deeply to read") from None
    except ValueError as err:
        # Python refuses to convert an integer of more than 4,300 digits; the parser does not say where it was.
        match = _LONG_INTEGER.search(text)
        if match is None:
            raise DocumentError(Reason.SYNTAX, f"TOML value cannot be read: {err}") from None
        line, col = _text_position(text, match.start())
        raise DocumentError(Reason.NUMBER, "an integer of thousands of digits: TOML integers are 64-bit "
                            f"({INT64_MIN} to {INT64_MAX})", line=line, col=col,
                            source_line=_source_line(text, line)) from None
    check_structure(data)
    return data


def byte_position(raw: bytes, offset: int) -> tuple[int, int, str]:
    """1-based line and column of a byte offset, and that line's text."""
    line_start = raw.rfind(b"\n", 0, offset) + 1
    line_end = raw.find(b"\n", offset)
    source = raw[line_start : line_end if line_end != -1 else len(raw)].decode("utf-8", errors="replace")
    col = len(raw[line_start:offset].decode("utf-8", errors="replace")) + 1
    return raw.count(b"\n", 0, offset) + 1, col, source


def _json_int(text: str):
    def parse(digits: str) -> int:
        value = int(digits) if len(digits) <= _MAX_INT_CHARACTERS else None
        if value is None or not INT64_MIN <= value <= INT64_MAX:
            line, col = _text_position(text, text.find(digits))
            raise DocumentError(Reason.NUMBER, f"the integer {_cut(digits)} is outside the 64-bit range",
                                line=line, col=col, source_line=_source_line(text, line))
        return value

    return parse


def _json_float(digits: str) -> float:
    value = float(digits)
    if not math.isfinite(value):
        raise DocumentError(Reason.NUMBER, f"the number {_cut(digits)} is too large for a 64-bit float")
    return value


def _json_constant(name: str) -> float:
    raise DocumentError(Reason.NUMBER, f"{name} is not a JSON number")


def check_structure(data: Any) -> None:
    """Nesting at most MAX_DEPTH deep and integers within 64 bits, in one iterative walk (a recursive one could
    itself recurse too deeply)."""
    pending: list[tuple[Any, int]] = [(data, 0)]
    while pending:
        node, depth = pending.pop()
        if isinstance(node, (dict, list)):
            if depth >= MAX_DEPTH:
                raise DocumentError(Reason.TOO_DEEP, f"nests arrays or tables more than {MAX_DEPTH} levels deep")
            pending += [(child, depth + 1) for child in (node.values() if isinstance(node, dict) else node)]
        elif isinstance(node, int) and not isinstance(node, bool) and not INT64_MIN <= node <= INT64_MAX:
            path = _path_to(data, node)
            raise DocumentError(Reason.NUMBER, f"`{_dotted(path)}` is an integer outside the 64-bit range "
                                f"({INT64_MIN} to {INT64_MAX})", where=path)


def _path_to(data: Any, target: Any) -> tuple[str | int, ...]:
    """The key path of the value `target` (by identity) in `data`, whose depth is already checked."""
    pending: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())]
    while pending:
        node, path = pending.pop()
        if node is target:
            return path
        if isinstance(node, (dict, list)):
            pending += [(value, (*path, key)) for key,
                        value in (node.items() if isinstance(node, dict) else enumerate(node))]
    return ()


def _dotted(path: tuple[str | int, ...]) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path).lstrip(".")


def _text_position(text: str, index: int) -> tuple[int | None, int | None]:
    if index < 0:
        return None, None
    line_start = text.rfind("\n", 0, index) + 1
    return text.count("\n", 0, index) + 1, index - line_start + 1


def _source_line(text: str, line: int | None) -> str | None:
    if line is None or line < 1:
        return None
    lines = text.split("\n", line)
    return lines[line - 1][:200] if len(lines) >= line else None


def _cut(digits: str, keep: int = 24) -> str:
    return digits if len(digits) <= keep else f"{digits[:keep]}... ({len(digits)} characters)"


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit:,} bytes"
