"""Files no reader may hang, exhaust memory or raise a traceback on: one per way a document can be hostile."""

from __future__ import annotations

import os
from pathlib import Path

# name -> what the file holds (None: a FIFO; a str: a path that already exists)
JSON_CASES = {
    "fifo": None,
    "dev-zero": "/dev/zero",
    "not-utf8": b'{"schema": "power.plan/v1", "name": "caf\xe9"}',
    "nested-100k": b"[" * 100_000 + b"]" * 100_000,
    "integer-5000-digits": b'{"schema": ' + b"9" * 5000 + b"}",
    "integer-past-64-bits": b'{"schema": 18446744073709551616}',
    "nan": b'{"schema": NaN}',
}
TOML_CASES = {
    "toml-nested-100k": b"a = " + b"[" * 100_000 + b"]" * 100_000,
    "toml-integer-5000-digits": b"a = " + b"9" * 5000,
    "toml-integer-past-64-bits": b"[t]\na = 18446744073709551616",
    "toml-not-utf8": b'name = "caf\xe9"',
}
# Cases that are not JSON-specific: every text reader (env files, units) must refuse them.
TEXT_CASES = ("fifo", "dev-zero", "not-utf8")


def hostile(directory: Path, case: str, suffix: str = ".json") -> Path:
    """The hostile file `case` (from JSON_CASES or TOML_CASES) under `directory`."""
    content = {**JSON_CASES, **TOML_CASES}[case]
    if isinstance(content, str):
        return Path(content)
    path = Path(directory) / f"{case}{'.toml' if case.startswith('toml-') else suffix}"
    if content is None:
        os.mkfifo(path)
    else:
        path.write_bytes(content)
    return path
