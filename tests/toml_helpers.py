"""Write small Power TOML files into a test's tmp directory."""

from __future__ import annotations

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
