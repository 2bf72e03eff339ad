"""Drift: terraform-plan-like add/change/remove with the changed fields and a summary line."""

from __future__ import annotations

from power.orchestrator.fleet.drift import ADD, CHANGE, REMOVE, diff, render, summary


def _record(**fields):
    base = {"profile": "balanced-k7s7", "mode": "mtp", "k": 7, "s": 7, "plan_digest": "1" * 64}
    return {**base, **fields}


def test_no_drift_when_records_match() -> None:
    records = {"gpu-a/qwen": _record()}
    assert diff(records, dict(records)) == []
    assert summary([]) == "No changes. The fleet matches the lock."


def test_add_change_remove_with_changed_fields() -> None:
    applied = {"gpu-a/qwen": _record(), "gpu-b/qwen": _record()}
    planned = {"gpu-a/qwen": _record(s=6, profile="guarded-k7s6", plan_digest="2" * 64), "gpu-c/qwen": _record()}
    changes = diff(applied, planned)
    assert [(c.action, c.key) for c in changes] == [(CHANGE, "gpu-a/qwen"), (REMOVE, "gpu-b/qwen"), (ADD, "gpu-c/qwen")]
    changed = changes[0].fields
    assert [f.name for f in changed] == ["profile", "s", "plan_digest"]
    assert (changed[1].old, changed[1].new) == (7, 6)
    text = render(changes)
    assert '  ~ gpu-a/qwen will change\n      ~ profile: "balanced-k7s7" -> "guarded-k7s6"' in text
    assert "      ~ s: 7 -> 6" in text
    assert "  - gpu-b/qwen will be removed" in text
    assert "  + gpu-c/qwen will be added" in text
    assert text.endswith("Plan: 1 to add, 1 to change, 1 to remove.")


def test_a_new_field_shows_as_from_none() -> None:
    [change] = diff({"h/m": _record()}, {"h/m": _record(fr_vocab_size=8192, plan_digest="3" * 64)})
    assert "~ fr_vocab_size: (none) -> 8192" in render([change])
    assert change.to_json()["action"] == "change"
