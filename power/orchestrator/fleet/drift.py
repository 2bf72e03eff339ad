"""Drift: what the fleet would change against the plans last applied, shown the way `terraform plan` does.

`+` a deployment the lock does not have, `~` one whose plan changed (with each
changed field, old -> new), `-` one the lock has and the fleet no longer
declares; then a summary line. Records are the flat dicts `fleet.plan_record`
builds; `plan_digest` changes whenever anything in the plan does, so it is
listed last among the changed fields. `objects_digest` (fleets with
[kubernetes]) changes whenever the rendered cluster objects do: a new image,
another node, another volume.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ADD, CHANGE, REMOVE = "+", "~", "-"


@dataclass(frozen=True)
class FieldChange:
    name: str
    old: Any
    new: Any


@dataclass(frozen=True)
class Change:
    action: str
    key: str
    fields: tuple[FieldChange, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {
            "action": {ADD: "add", CHANGE: "change", REMOVE: "remove"}[self.action],
            "key": self.key,
            "fields": [{"name": f.name, "old": f.old, "new": f.new} for f in self.fields],
        }


def diff(applied: dict[str, dict[str, Any]], planned: dict[str, dict[str, Any]]) -> list[Change]:
    """Changes from the applied records to the planned ones, ordered by deployment key."""
    changes = []
    for key in sorted(applied.keys() | planned.keys()):
        if key not in applied:
            changes.append(Change(ADD, key))
        elif key not in planned:
            changes.append(Change(REMOVE, key))
        else:
            fields = _changed_fields(applied[key], planned[key])
            if fields:
                changes.append(Change(CHANGE, key, fields))
    return changes


def summary(changes: list[Change]) -> str:
    if not changes:
        return "No changes. The fleet matches the lock."
    counts = {action: sum(1 for c in changes if c.action == action) for action in (ADD, CHANGE, REMOVE)}
    return f"Plan: {counts[ADD]} to add, {counts[CHANGE]} to change, {counts[REMOVE]} to remove."


def render(changes: list[Change]) -> str:
    """The terraform-plan-like text: one block per change, then the summary line."""
    lines = []
    for change in changes:
        verb = {ADD: "will be added", CHANGE: "will change", REMOVE: "will be removed"}[change.action]
        lines.append(f"  {change.action} {change.key} {verb}")
        for item in change.fields:
            lines.append(f"      ~ {item.name}: {_show(item.old)} -> {_show(item.new)}")
    lines.append(summary(changes))
    return "\n".join(lines)


def _changed_fields(old: dict[str, Any], new: dict[str, Any]) -> tuple[FieldChange, ...]:
    names = [name for name in sorted(old.keys() | new.keys()) if name != "plan_digest"] + ["plan_digest"]
    return tuple(FieldChange(name, _short(old.get(name), name), _short(new.get(name), name))
                 for name in names if old.get(name) != new.get(name))


def _short(value: Any, name: str) -> Any:
    """Digests (`plan_digest`, `objects_digest`) are shown by their first 12 hex digits."""
    return value[:12] if name.endswith("_digest") and isinstance(value, str) else value


def _show(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)
