"""Write small Power TOML files into a test's tmp directory."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

PROFILE_HEAD = 'schema = "power.profile/v1"\nname = "p"\n'
MANIFEST_HEAD = 'schema = "power.manifest/v1"\nname = "m"\n'
SHA_A = "a" * 64
SHA_B = "b" * 64


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def codes(loaded) -> list[str]:
    return [finding.code for finding in loaded.findings]


def toml_key(key: str) -> str:
    return key if _bare(key) else json.dumps(key, ensure_ascii=False)


def _bare(key: str) -> bool:
    return bool(key) and all(c.isascii() and (c.isalnum() or c in "_-") for c in key)


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
