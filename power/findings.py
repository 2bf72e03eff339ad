"""Findings: what every check reports, with a stable code, a location and a fix.

A finding names the file and the place in it (TOML line/column, or a GGUF byte
offset), says what was found, and a hint says what to do. The text rendering is
ruff/uv-like: `path:line:col: CODE message`, the source line, carets under the
offending key or value (`^^^^`), the hint.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


class Severity(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True)
class Finding:
    code: str
    severity: Severity
    message: str
    file: str | None = None
    line: int | None = None
    col: int | None = None
    # Just past the offending key or value on `line` (end_col - col characters), when known.
    end_col: int | None = None
    hint: str | None = None
    # A GGUF byte offset, for artifact findings.
    offset: int | None = None
    # The dotted place in the document (`drafters[1].sha256`), when there is one.
    where: str | None = None
    # For a finding about an artifact: `manifest.toml:LINE:COL` of the manifest key that names it (`where`).
    declared_at: str | None = None
    # The offending source line, for the caret rendering.
    source_line: str | None = field(default=None, compare=False)

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["severity"] = self.severity.value
        data.pop("source_line")
        return data

    def location(self) -> str:
        parts = [self.file or "<input>"]
        if self.line is not None:
            parts.append(str(self.line))
            if self.col is not None:
                parts.append(str(self.col))
        elif self.offset is not None:
            parts.append(f"byte {self.offset}")
        return ":".join(parts)

    def render(self) -> str:
        """Human text: location, code and message; then the source line, carets under the offending text; the hint.

        Every character a terminal would act on (line breaks, escape sequences, carriage returns, NUL, ...) inside
        a part is written as an escape: a file name, a key or a value from a hostile file can neither hide a
        finding nor forge one."""
        safe = terminal_safe
        lines = [f"{safe(self.location())}: {self.code} [{self.severity.value}] {safe(self.message)}"]
        if self.source_line is not None and self.line is not None:
            gutter = f"{self.line} | "
            lines.append(f"  {gutter}{safe(self.source_line.rstrip())}")
            if self.col is not None:
                width = max(1, self.end_col - self.col) if self.end_col is not None else 1
                lines.append("  " + " " * (len(gutter) + self.col - 1) + "^" * width)
        if self.declared_at:
            lines.append(f"  named by {safe(self.where or 'the manifest')} at {safe(self.declared_at)}")
        if self.hint:
            lines.append(f"  hint: {safe(self.hint)}")
        return "\n".join(lines)


def terminal_safe(text: str) -> str:
    """`text` with every character but printable ones written as an escape (`\\x0a`, `\\x1b`, `\\u202e`)."""
    return "".join(ch if ch.isprintable() or ch == "\t" else
                   (f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}") for ch in text)


def has_errors(findings: list[Finding]) -> bool:
    return any(f.is_error for f in findings)


class PowerError(Exception):
    """A refusal that carries its finding, so every refusal prints (and parses, with `--json`) like a check.

    Subclasses name their default code; a raise site may give a more precise one from the catalogue.
    """

    code: str  # each subclass names its default

    def __init__(self, message: str, *, code: str | None = None, hint: str | None = None, file: str | None = None,
                 offset: int | None = None, where: str | None = None) -> None:
        self.finding = Finding(code=code or self.code, severity=Severity.ERROR, message=message, file=file,
                               offset=offset, hint=hint, where=where)
        super().__init__(self.finding.render())

    @classmethod
    def of(cls, finding: Finding) -> PowerError:
        """The refusal that carries `finding` as it is (with its line and column)."""
        error = cls(finding.message, code=finding.code, hint=finding.hint, file=finding.file, offset=finding.offset)
        error.finding = finding
        error.args = (finding.render(),)
        return error
