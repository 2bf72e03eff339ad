"""`power pull --pin`: the manifest with each pulled artifact's commit, size and sha256 written in (a lock, as
`terraform init` writes one), through tomlkit so the file's comments and layout stay as they were."""

from __future__ import annotations

from typing import Any

import tomlkit

from power.artifacts.pull.place import Pulled
from power.orchestrator.inputs.locator import parse_where


def pinned(text: str, pulled: list[Pulled]) -> str:
    """`text` with each artifact's revision resolved to its commit and its size and sha256 declared."""
    document = tomlkit.parse(text)
    for each in pulled:
        entry = _table(document, each.wanted.where)
        if each.commit is not None:
            source = _table(document, each.wanted.source_at or each.wanted.where)["source"]
            if source.get("revision") != each.commit:
                source["revision"] = each.commit
        if entry.get("size") is None:
            entry["size"] = tomlkit.value(f"{each.size:_}")
        if entry.get("sha256") is None:
            entry["sha256"] = each.sha256
    return tomlkit.dumps(document)


def _table(document: Any, where: str) -> Any:
    table = document
    for part in parse_where(where):
        table = table[part]
    return table
