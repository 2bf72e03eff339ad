"""Where a dotted key lives in TOML source text: `drafters[1].sha256` -> line 14, column 1.

tomli returns values without positions, so this module scans the text once,
lazily (only as far as the paths asked for), and records, for every key path,
where its key and its value start and end: tables, arrays of tables, dotted
keys, inline tables and array elements. It never raises: on text it cannot
follow it keeps what it found so far, and a path it does not know falls back to
its nearest known ancestor.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable

KeyPath = tuple[str | int, ...]
Span = tuple[int, int]  # [start, end) offsets in the text

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_WHERE_PART = re.compile(r'\.?(?:"((?:[^"\\]|\\.)*)"|([^.\[\]"]+))|\[(\d+)\]')
# Values nested deeper than this are skipped, not followed (tomli itself stops at 400).
_MAX_DEPTH = 64


@dataclass(frozen=True)
class Position:
    line: int  # 1-based
    col: int  # 1-based, in characters
    source_line: str
    # Just past the key or value's last character on this line (a value that goes on over more lines ends here at
    # the line's end), so end_col - col characters are underlined.
    end_col: int


def parse_where(where: str) -> KeyPath:
    """`drafters[1].sha256` -> ("drafters", 1, "sha256"); `labels."a.b"` -> ("labels", "a.b")."""
    parts: list[str | int] = []
    for match in _WHERE_PART.finditer(where):
        quoted, bare, index = match.groups()
        if index is not None:
            parts.append(int(index))
        else:
            parts.append(quoted if quoted is not None else bare.strip())
    return tuple(parts)


def format_where(path: KeyPath) -> str:
    """("drafters", 1, "sha256") -> `drafters[1].sha256`."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            name = part if _BARE_KEY.fullmatch(part) else json.dumps(part)
            text += f".{name}" if text else name
    return text


class TomlLocator:
    """Positions of keys and values in one TOML text."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._scan = _Scan(text)

    def key(self, path: KeyPath) -> Position | None:
        """Where the key of `path` (or of its nearest located ancestor) is."""
        return self._nearest(path, self._scan.keys, self._scan.values)

    def value(self, path: KeyPath) -> Position | None:
        """Where the value of `path` is (or, failing that, its key or an ancestor's)."""
        return self._nearest(path, self._scan.values, self._scan.keys)

    def _nearest(self, path: KeyPath, first: dict[KeyPath, Span], second: dict[KeyPath, Span]) -> Position | None:
        # The text is scanned only as far as the path's first occurrence (to the end for a path it lacks).
        path = tuple(path)
        self._scan.run_until(lambda: path in first or path in second)
        for length in range(len(path), 0, -1):
            prefix = path[:length]
            span = first.get(prefix, second.get(prefix))
            if span is not None:
                return self._position(span)
        return None

    def _position(self, span: Span) -> Position:
        offset, end = span
        start = self._text.rfind("\n", 0, offset) + 1
        line_end = self._text.find("\n", start)
        source_line = self._text[start : line_end if line_end != -1 else len(self._text)].rstrip("\r")
        col = offset - start + 1
        end_col = max(min(end - start, len(source_line.rstrip())) + 1, col + 1)
        return Position(line=self._text.count("\n", 0, start) + 1, col=col, source_line=source_line, end_col=end_col)


class _Scan:
    """A lenient single pass over TOML text that records offsets; every step moves forward or stops."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0
        self.keys: dict[KeyPath, Span] = {}
        self.values: dict[KeyPath, Span] = {}
        # Array-of-tables path -> index of its latest element.
        self._latest: dict[KeyPath, int] = {}
        self._table: KeyPath = ()

    def run_until(self, found: Callable[[], bool]) -> None:
        """Scan on, one top-level statement at a time, until `found()` or the end of the text."""
        while not found() and self._skip_blank_lines():
            before = self.i
            if self._peek() == "[":
                self._table = self._table_header(self._table)
            else:
                self._key_value(self._table)
            self._skip_to_next_line()
            if self.i <= before:
                self.i = before + 1

    # -- structure -------------------------------------------------------------

    def _table_header(self, current: KeyPath) -> KeyPath:
        start = self.i
        is_array = self.text.startswith("[[", self.i)
        self.i += 2 if is_array else 1
        names = [name for name, _ in self._key()]
        if not names:
            return current
        closing = "]]" if is_array else "]"
        span = (start, self.i + len(closing) if self.text.startswith(closing, self.i) else self.i)
        path = self._with_latest_indices(tuple(names))
        if is_array:
            index = self._latest.get(path, -1) + 1
            self._latest[path] = index
            self.keys.setdefault(path, span)
            path = path + (index,)
        self.keys[path] = span
        return path

    def _with_latest_indices(self, names: KeyPath) -> KeyPath:
        """[[a.b]] inside the latest [[a]] element is a.<latest>.b."""
        path: KeyPath = ()
        for name in names[:-1]:
            path = path + (name,)
            if path in self._latest:
                path = path + (self._latest[path],)
        return path + names[-1:]

    def _key_value(self, table: KeyPath, depth: int = 0) -> None:
        segments = self._key()
        if not segments:
            return
        path = table
        for name, span in segments:
            path = path + (name,)
            self.keys.setdefault(path, span)
        self._skip_spaces()
        if self._peek() != "=":
            return
        self.i += 1
        self._skip_spaces()
        self._value(path, depth)

    def _value(self, path: KeyPath, depth: int) -> None:
        char = self._peek()
        if not char:
            return
        start = self.i
        if depth > _MAX_DEPTH and char in "[{":
            self._skip_nested()
        elif char == "{":
            self._inline_table(path, depth)
        elif char == "[":
            self._array(path, depth)
        elif char in "\"'":
            self._string()
        else:
            self._scalar()
        # A scalar runs up to the next separator: its span ends before the spaces in front of it.
        end = start + len(self.text[start : self.i].rstrip())
        self.values.setdefault(path, (start, max(end, start + 1)))

    def _inline_table(self, path: KeyPath, depth: int) -> None:
        self.i += 1
        while True:
            self._skip_blank()
            if self._peek() in ("}", ""):
                self.i += 1
                return
            before = self.i
            self._key_value(path, depth + 1)
            self._skip_blank()
            if self._peek() == ",":
                self.i += 1
            elif self._peek() == "}" or self.i == before:
                self.i += 1
                return

    def _array(self, path: KeyPath, depth: int) -> None:
        self.i += 1
        index = 0
        while True:
            self._skip_blank()
            if self._peek() in ("]", ""):
                self.i += 1
                return
            before = self.i
            self._value(path + (index,), depth + 1)
            index += 1
            self._skip_blank()
            if self._peek() == ",":
                self.i += 1
            elif self._peek() == "]" or self.i == before:
                self.i += 1
                return

    def _skip_nested(self) -> None:
        level = 0
        while self.i < len(self.text):
            char = self.text[self.i]
            level += char in "[{"
            level -= char in "]}"
            self.i += 1
            if level <= 0:
                return

    # -- tokens ----------------------------------------------------------------

    def _key(self) -> list[tuple[str, Span]]:
        segments: list[tuple[str, Span]] = []
        while True:
            self._skip_spaces()
            offset = self.i
            if self._peek() in "\"'" and self._peek():
                name = self._string()
            else:
                match = _BARE_KEY.match(self.text, self.i)
                if match is None:
                    return segments
                name = match.group()
                self.i = match.end()
            segments.append((name, (offset, self.i)))
            self._skip_spaces()
            if self._peek() != ".":
                return segments
            self.i += 1

    def _string(self) -> str:
        quote = self.text[self.i]
        if self.text.startswith(quote * 3, self.i):
            return self._multiline_string(quote)
        start = self.i + 1
        j = start
        while j < len(self.text) and self.text[j] not in (quote, "\n"):
            j += 2 if quote == '"' and self.text[j] == "\\" else 1
        raw = self.text[start : min(j, len(self.text))]
        self.i = j + 1
        return _unescape(raw) if quote == '"' else raw

    def _multiline_string(self, quote: str) -> str:
        start = self.i + 3
        j = start
        while True:
            j = self.text.find(quote * 3, j)
            if j == -1:
                self.i = len(self.text)
                return self.text[start:]
            if quote == '"' and _escaped(self.text, j):
                j += 1
                continue
            break
        end = j
        while self.text.startswith(quote, end + 3) and end - j < 2:
            end += 1
        self.i = end + 3
        return self.text[start:end]

    def _scalar(self) -> None:
        while self.i < len(self.text) and self.text[self.i] not in ",]}\n#":
            self.i += 1

    # -- whitespace --------------------------------------------------------------

    def _peek(self) -> str:
        return self.text[self.i] if self.i < len(self.text) else ""

    def _skip_spaces(self) -> None:
        while self._peek() in (" ", "\t") and self._peek():
            self.i += 1

    def _skip_blank(self) -> None:
        """Spaces, newlines and comments."""
        while self.i < len(self.text):
            char = self.text[self.i]
            if char in " \t\r\n":
                self.i += 1
            elif char == "#":
                self._skip_to_next_line()
            else:
                return

    def _skip_blank_lines(self) -> bool:
        self._skip_blank()
        return self.i < len(self.text)

    def _skip_to_next_line(self) -> None:
        end = self.text.find("\n", self.i)
        self.i = len(self.text) if end == -1 else end + 1


def _escaped(text: str, index: int) -> bool:
    backslashes = 0
    while index - backslashes - 1 >= 0 and text[index - backslashes - 1] == "\\":
        backslashes += 1
    return backslashes % 2 == 1


def _unescape(raw: str) -> str:
    try:
        return json.loads(f'"{raw}"')
    except ValueError:
        return raw
