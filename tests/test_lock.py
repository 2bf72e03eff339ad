"""The fleet lock: round trip, digest protection, newer schema versions, atomic writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from power.orchestrator.fleet.lock import LOCK_SCHEMA, FleetLock, LockConflict, body_digest, read_lock, write_lock

RECORD = {"host": "gpu-a", "manifest": "qwen", "profile": "balanced-k7s7", "mode": "mtp", "k": 7, "s": 7,
          "plan_digest": "a" * 64}


def _lock_with_one_record() -> FleetLock:
    return FleetLock("lab", deployments={"gpu-a/qwen": dict(RECORD)}, plans={"a" * 64: {"name": "qwen"}})


def test_a_missing_lock_reads_as_empty(tmp_path: Path) -> None:
    lock, findings = read_lock(tmp_path / "fleet.lock", "lab")
    assert findings == []
    assert lock == FleetLock("lab")


def test_round_trip_keeps_records_plans_and_rollout(tmp_path: Path) -> None:
    path = tmp_path / "fleet.lock"
    lock = _lock_with_one_record()
    lock.rollout = {"profile": "p", "candidates": {}, "previous": {}}
    write_lock(path, lock)
    again, findings = read_lock(path, "lab")
    assert findings == []
    assert again == lock
    assert json.loads(path.read_text())["schema"] == LOCK_SCHEMA


def test_plans_no_record_names_are_pruned_on_write(tmp_path: Path) -> None:
    path = tmp_path / "fleet.lock"
    lock = _lock_with_one_record()
    lock.plans["b" * 64] = {"name": "orphan"}
    write_lock(path, lock)
    again, _ = read_lock(path, "lab")
    assert set(again.plans) == {"a" * 64}


def test_a_hand_edit_is_a_located_digest_finding(tmp_path: Path) -> None:
    path = tmp_path / "fleet.lock"
    write_lock(path, _lock_with_one_record())
    path.write_text(path.read_text().replace('"k": 7', '"k": 9'))
    lock, findings = read_lock(path, "lab")
    assert lock is None
    [finding] = findings
    assert finding.code == "PWR064"
    assert finding.file == str(path)
    assert '"digest"' in finding.source_line
    assert path.read_text().splitlines()[finding.line - 1] == finding.source_line
    assert "edited by hand" in finding.message


def test_a_newer_schema_version_is_refused_with_its_location(tmp_path: Path) -> None:
    path = tmp_path / "fleet.lock"
    write_lock(path, _lock_with_one_record())
    path.write_text(path.read_text().replace(LOCK_SCHEMA, "power.fleet-lock/v3"))
    lock, findings = read_lock(path, "lab")
    assert lock is None
    [finding] = findings
    assert finding.code == "PWR063"
    assert finding.line == 2 and '"schema"' in finding.source_line
    assert "upgrade Power" in finding.hint


def test_malformed_json_points_at_the_error(tmp_path: Path) -> None:
    path = tmp_path / "fleet.lock"
    path.write_text('{\n  "schema": "power.fleet-lock/v1",\n  "deployments": {,\n}\n')
    lock, [finding] = read_lock(path, "lab")
    assert lock is None
    assert finding.code == "PWR065"
    assert finding.line == 3


def test_something_else_is_not_a_lock(tmp_path: Path) -> None:
    path = tmp_path / "fleet.lock"
    path.write_text(json.dumps({"schema": "power.plan/v1"}))
    lock, [finding] = read_lock(path, "lab")
    assert lock is None and finding.code == "PWR065"


def test_a_failed_write_leaves_the_old_lock_and_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "fleet.lock"
    write_lock(path, _lock_with_one_record())
    before = path.read_text()
    broken = _lock_with_one_record()
    broken.deployments["gpu-b/qwen"] = {"plan_digest": "a" * 64, "bad": object()}
    try:
        write_lock(path, broken)
    except TypeError:
        pass
    else:
        raise AssertionError("an unserialisable record must not be written")
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [".fleet.lock.guard", "fleet.lock"]


def test_a_write_refuses_when_the_lock_changed_since_it_was_read(tmp_path: Path) -> None:
    path = tmp_path / "fleet.lock"
    write_lock(path, _lock_with_one_record())
    first, _ = read_lock(path, "lab")
    second, _ = read_lock(path, "lab")
    second.deployments["gpu-a/qwen"]["k"] = 5
    write_lock(path, second)
    written = path.read_text()
    first.deployments["gpu-a/qwen"]["s"] = 6
    with pytest.raises(LockConflict) as conflict:
        write_lock(path, first)
    assert conflict.value.finding.code == "PWR068" and conflict.value.finding.file == str(path)
    assert path.read_text() == written
    second.rollout = {"profile": "p", "candidates": {}, "previous": {}}
    write_lock(path, second)  # the writer that holds the current lock may write again
    fresh = FleetLock("lab")
    with pytest.raises(LockConflict):
        write_lock(path, fresh)  # an empty lock "read" from a missing file may not replace an existing one


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**53, max_value=2**53) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=12)


@settings(max_examples=60, deadline=None)
@given(records=st.dictionaries(st.text(min_size=1, max_size=10), st.dictionaries(st.text(max_size=6), JSON_VALUES,
                                                                                 max_size=4), max_size=4))
def test_any_json_records_round_trip_with_a_valid_digest(tmp_path_factory: pytest.TempPathFactory,
                                                         records: dict) -> None:
    path = tmp_path_factory.mktemp("lock") / "fleet.lock"
    digest = "c" * 64
    lock = FleetLock("lab", deployments={key: {**fields, "plan_digest": digest} for key, fields in records.items()},
                     plans={digest: {"name": "p"}} if records else {})
    write_lock(path, lock)
    again, findings = read_lock(path, "lab")
    assert findings == [] and again == lock


def test_a_lock_names_its_fleet_and_is_refused_for_another(tmp_path: Path) -> None:
    path = tmp_path / "fleet.lock"
    write_lock(path, _lock_with_one_record())
    assert json.loads(path.read_text())["fleet"] == "lab"
    lock, [finding] = read_lock(path, "cpu-lab")
    assert lock is None and finding.code == "PWR083"
    assert finding.source_line == '  "fleet": "lab",' and finding.line == 3
    assert "--lock" in finding.hint


def test_a_version_1_lock_is_read_as_the_reading_fleets_and_named_when_written(tmp_path: Path) -> None:
    """Locks written before they named their fleet stay readable; the next write records the fleet."""
    path = tmp_path / "fleet.lock"
    body = {"schema": "power.fleet-lock/v1", "deployments": {"gpu-a/qwen": dict(RECORD)},
            "plans": {"a" * 64: {"name": "qwen"}}, "rollout": None}
    path.write_text(json.dumps({**body, "digest": body_digest(body)}))
    lock, findings = read_lock(path, "lab")
    assert findings == [] and lock.deployments == {"gpu-a/qwen": RECORD}
    write_lock(path, lock)
    assert json.loads(path.read_text())["schema"] == LOCK_SCHEMA
    assert read_lock(path, "other")[1][0].code == "PWR083"
