"""The fleet lock (`fleet.lock`): the plans last applied to each deployment, and the rollout state.

A JSON document, schema-versioned and digest-protected, always written atomically:

    schema       "power.fleet-lock/v2"
    fleet        the name of the fleet the lock belongs to (the fleet file's `name`, else its file name):
                 a lock is refused for any other fleet (PWR083), so one fleet never rewrites another's
    deployments  {key: record}: what each deployment runs now (see `fleet.plan_record`)
    plans        {plan digest: plan document}: every plan a record or the rollout names,
                 stored once however many deployments share it
    rollout      the staged rollout in progress or last finished, or null (see `rollout.py`)
    digest       sha256 of the canonical JSON of everything above

Reading never raises: a missing lock is an empty one; a lock written for another
fleet, a lock from a newer schema version, a lock whose digest does not match
(edited by hand) or one that is not a lock at all comes back as a located
finding, and commands that would write a lock refuse to run on top of it. A
version-1 lock (written before locks named their fleet) is read as the reading
fleet's, and names it when next written. Writing checks, under an exclusive lock
on a guard file (`.fleet.lock.guard`), that the file is still the one that was read.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from power.artifacts.atomic import write_text_atomic
from power.artifacts.bounded_reader import MAX_JSON_BYTES, DocumentError, Reason, parse_json, read_json, read_text
from power.documents.plan import canonical_json
from power.findings import Finding, Severity

LOCK_KIND = "power.fleet-lock"
LOCK_VERSION = 2
LOCK_SCHEMA = f"{LOCK_KIND}/v{LOCK_VERSION}"
_SCHEMA_PATTERN = re.compile(rf"^{re.escape(LOCK_KIND)}/v(\d+)$")


class LockConflict(Exception):
    """The lock was not written: the one on disk is no longer the one this command read (another command wrote it
    meanwhile, PWR068), or its folder cannot be written (PWR018)."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(finding.render())
        self.finding = finding


@dataclass
class FleetLock:
    fleet: str
    deployments: dict[str, dict[str, Any]] = field(default_factory=dict)
    plans: dict[str, dict[str, Any]] = field(default_factory=dict)
    rollout: dict[str, Any] | None = None
    # The digest the file had when it was read (None: there was no file); a write checks it is still there.
    read_digest: str | None = field(default=None, compare=False)

    def body(self) -> dict[str, Any]:
        return {
            "schema": LOCK_SCHEMA,
            "fleet": self.fleet,
            "deployments": self.deployments,
            "plans": self.plans,
            "rollout": self.rollout,
        }

    def digest(self) -> str:
        return body_digest(self.body())

    def prune_plans(self) -> None:
        """Drop stored plans that no record and no rollout names any more."""
        named = {record["plan_digest"] for record in self.deployments.values()}
        named |= set(_digests_in(self.rollout))
        self.plans = {digest: plan for digest, plan in self.plans.items() if digest in named}


def body_digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(body)).hexdigest()


def read_lock(path: Path, fleet: str) -> tuple[FleetLock | None, list[Finding]]:
    """Fleet `fleet`'s lock at `path`: an empty lock when the file does not exist, None with findings when it cannot
    be used (another fleet's lock among them)."""
    path = Path(path)
    try:
        text = read_text(path, MAX_JSON_BYTES)
        data = parse_json(text)
    except DocumentError as err:
        if err.reason is Reason.MISSING:
            return FleetLock(fleet), []
        return None, [err.finding("PWR065", path, "restore the lock from version control, or delete it and run "
                                  "`power fleet review FLEET --write-lock` to record the current plans",
                                  what="the fleet lock")]
    problem = _schema_problem(path, data, text)
    if problem is not None:
        return None, [problem]
    stored = data.get("digest")
    body = {key: data.get(key) for key in _body_keys(data["schema"])}
    if stored != body_digest(body):
        line, col = _key_position(text, "digest")
        return None, [_finding(
            "PWR064", path,
            f"the fleet lock's digest does not match its content (it says {str(stored)[:16]}..., the content hashes to "
            f"{body_digest(body)[:16]}...): the lock was edited by hand",
            text=text, line=line, col=col,
            hint="never edit fleet.lock; restore it from version control, or delete it and run "
                 "`power fleet review FLEET --write-lock` to record the current plans")]
    owner = data.get("fleet", fleet)
    if owner != fleet:
        line, col = _key_position(text, "fleet")
        return None, [_finding(
            "PWR083", path, f"this lock belongs to fleet {owner!r}, not {fleet!r}: writing it for {fleet!r} would "
            f"remove the plans and rollout of fleet {owner!r}", text=text, line=line, col=col,
            hint=f"give fleet {fleet!r} a lock of its own with --lock (for example --lock {path.parent / fleet}.lock)")]
    return FleetLock(fleet=fleet, deployments=data["deployments"], plans=data["plans"], rollout=data["rollout"],
                     read_digest=stored), []


def write_lock(path: Path, lock: FleetLock) -> None:
    """Write the lock atomically (temp file + rename), with its digest.

    Under an exclusive lock on a guard file beside it, and only if the file on disk is still the one
    `lock` was read from: otherwise LockConflict, and nothing is written (two rollouts never interleave).
    """
    path = Path(path)
    lock.prune_plans()
    document = {**lock.body(), "digest": lock.digest()}
    text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    try:
        # Non-blocking open: a FIFO planted as the guard is an error here, never a hang.
        guard_fd = os.open(path.parent / f".{path.name}.guard", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK
                           | os.O_CLOEXEC, 0o666)
        with os.fdopen(guard_fd, "a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            on_disk = _digest_on_disk(path)
            if on_disk != lock.read_digest:
                raise LockConflict(
                    Finding(
                        code="PWR068",
                        severity=Severity.ERROR,
                        file=str(path),
                        message="the fleet lock changed on disk while this command ran "
                        "(another review or rollout wrote it)",
                        hint="nothing was written; run the command again on the lock as it is now",
                    )
                )
            write_text_atomic(path, text)
    except OSError as err:
        raise LockConflict(
            Finding(
                code="PWR018",
                severity=Severity.ERROR,
                file=str(path),
                message=f"cannot write the fleet lock ({err.strerror or err})",
                hint="nothing was written; choose a --lock path in a folder you can write to",
            )
        ) from None
    lock.read_digest = document["digest"]


def _digest_on_disk(path: Path) -> str | None:
    try:
        return read_json(path).get("digest")
    except DocumentError as err:
        return None if err.reason is Reason.MISSING else "unreadable"
    except AttributeError:
        return "unreadable"


def _schema_problem(path: Path, data: Any, text: str) -> Finding | None:
    if not isinstance(data, dict):
        return _finding("PWR065", path, "the fleet lock is not a JSON object", text=text, line=1, col=1,
                        hint="delete it and run `power fleet review FLEET --write-lock`")
    schema = data.get("schema")
    match = _SCHEMA_PATTERN.match(schema) if isinstance(schema, str) else None
    line, col = _key_position(text, "schema")
    if match is None:
        return _finding("PWR065", path, f"not a fleet lock (schema is {schema!r}, expected {LOCK_SCHEMA!r})",
                        text=text, line=line, col=col,
                        hint="point --lock at a fleet.lock written by `power fleet review --write-lock`")
    version = int(match.group(1))
    if version > LOCK_VERSION:
        return _finding("PWR063", path,
                        f"the fleet lock was written by a newer Power (schema {schema}; this Power reads "
                        f"{LOCK_SCHEMA} and older)", text=text, line=line, col=col,
                        hint="upgrade Power to the version that wrote this lock; never downgrade a lock by hand")
    missing = [key for key in (*_body_keys(match.group(0))[1:], "digest") if key not in data]
    if missing or not isinstance(data["deployments"], dict) or not isinstance(data["plans"], dict):
        return _finding("PWR065", path, "the fleet lock is malformed (missing or wrong: "
                                        f"{', '.join(missing) or 'deployments/plans'})",
                        text=text, line=1, col=1,
                        hint="restore the lock from version control, or delete it and run "
                             "`power fleet review FLEET --write-lock`")
    return None


def _body_keys(schema: str) -> tuple[str, ...]:
    """The keys the digest covers: version 1 locks did not name their fleet."""
    keys = ("schema", "deployments", "plans", "rollout")
    return keys if schema == f"{LOCK_KIND}/v1" else ("schema", "fleet", *keys[1:])


def _key_position(text: str, key: str) -> tuple[int, int]:
    """1-based line and column of the first occurrence of a JSON key, or the top of the file."""
    needle = f'"{key}"'
    for number, line in enumerate(text.splitlines(), start=1):
        col = line.find(needle)
        if col >= 0:
            return number, col + 1
    return 1, 1


def _finding(code: str, path: Path, message: str, *, text: str | None, line: int | None = None,
             col: int | None = None, hint: str) -> Finding:
    source_line = None
    if text is not None and line is not None:
        lines = text.splitlines()
        source_line = lines[line - 1] if 0 < line <= len(lines) else None
    return Finding(code=code, severity=Severity.ERROR, message=message, file=str(path), line=line, col=col,
                   hint=hint, source_line=source_line)


def _digests_in(rollout: dict[str, Any] | None) -> list[str]:
    if not rollout:
        return []
    records = list(rollout.get("candidates", {}).values()) + list(rollout.get("previous", {}).values())
    return [record["plan_digest"] for record in records]
