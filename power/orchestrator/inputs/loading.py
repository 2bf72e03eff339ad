"""Load a TOML file of any kind into its model, with every problem as a located finding.

`load_document(path)` never raises: it reads the file (refusing FIFOs, devices,
binary and oversized files), parses it with tomli, reads the kind from its
`schema` key, validates the model and runs the cross-field rules, and returns a
`Loaded` carrying the model (None when any error was found), every finding, and
a locator so that later checks can point at the exact line:

    loaded = load_manifest(path)
    loaded.finding("PWR112", "sha256 differs from the file", where="drafters[1].sha256")
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from power import codes, modes
from power.artifacts.bounded_reader import (
    MAX_TOML_BYTES,
    DocumentError,
    Reason,
    decode_utf8,
    parse_json,
    parse_toml,
    read_bytes,
)
from power.findings import Finding, Severity, has_errors
from power.orchestrator.inputs import rules
from power.orchestrator.inputs.locator import KeyPath, Position, TomlLocator, format_where, parse_where
from power.orchestrator.inputs.schema import GENERATED_KINDS, KIND_MODELS, RENAMED_KEYS, SCHEMA_VERSION, schema_id
from power.orchestrator.inputs.units import ACCEPTED_FORMS, SizeError

# Findings listed per file; the rest are counted in one PWR017 finding.
MAX_FINDINGS_PER_FILE = 200
_EDITOR_SCHEMA = re.compile(r"#:schema\s+(?P<target>\S+)[^\n]*")
_SCHEMA_VALUE = re.compile(r"^power\.(?P<kind>[A-Za-z0-9_-]+)/(?P<version>v\d+)$")
# Errors on these fields carry the speculation-settings code instead of the generic PWR022.
_FIELD_CODES = {
    "spec_draft_max": "PWR401",
    "spec_mtp_recurrent_snapshots": "PWR402",
    "spec_mtp_fr_vocab_size": "PWR403",
    "temperature": "PWR409",
}
_SCHEMA_HINT = "the first key of every file names its kind: " + ", ".join(
    f'schema = "{schema_id(k)}"' for k in KIND_MODELS
)


@dataclass
class Loaded:
    """One loaded file: its kind, its model (None on any error), its findings, and where its keys are.

    `kind` is manifest, profile, host or fleet, or for a document Power generates
    (plan, fleet-lock, ...) that kind with no model; None when the kind is unknown.
    """

    path: Path
    kind: str | None = None
    model: Any = None
    findings: list[Finding] = field(default_factory=list)
    data: dict[str, Any] | None = None
    text: str | None = None
    # sha256 of the bytes read: a plan records the digest of exactly what it was compiled from.
    sha256: str | None = None
    # Findings beyond MAX_FINDINGS_PER_FILE that were counted but never built.
    unlisted: int = field(default=0, repr=False)
    _locator: TomlLocator | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.model is not None and not has_errors(self.findings)

    def locate(self, where: str | KeyPath) -> tuple[int, int, str] | None:
        """(line, col, source line) of the key at `where` (`drafters[1].sha256`), or of its nearest ancestor."""
        position = self._position(where, at="key")
        return (position.line, position.col, position.source_line) if position else None

    def finding(
        self,
        code: str,
        message: str,
        where: str | KeyPath | None = None,
        hint: str | None = None,
        severity: Severity | str | None = None,
        at: str = "value",
    ) -> Finding:
        """A Finding for this file, placed at `where`'s value (at="value") or key (at="key")."""
        position = self._position(where, at) if where is not None else None
        path = parse_where(where) if isinstance(where, str) else where
        return Finding(
            code=code,
            severity=Severity(severity or codes.CODES[code][0]),
            message=message,
            file=str(self.path),
            line=position.line if position else None,
            col=position.col if position else None,
            end_col=position.end_col if position else None,
            hint=hint,
            where=format_where(path) if path else None,
            source_line=position.source_line if position else None,
        )

    def _position(self, where: str | KeyPath, at: str) -> Position | None:
        if self.text is None:
            return None
        if self._locator is None:
            self._locator = TomlLocator(self.text)
        path = parse_where(where) if isinstance(where, str) else tuple(where)
        position = self._locator.key(path) if at == "key" else self._locator.value(path)
        # A key missing from the top level has no place of its own: point at the file's start.
        return position or Position(line=1, col=1, source_line=self.text.split("\n", 1)[0], end_col=2)


def load_document(path: str | os.PathLike[str]) -> Loaded:
    """Load any Power TOML file; the kind comes from its `schema` key."""
    loaded = Loaded(path=Path(path))
    try:
        loaded.text = text = _read(loaded)
        loaded.data = data = _parse(loaded, text)
        kind = _read_kind(loaded, data, text)
    except _Unloadable as stop:
        loaded.findings.append(stop.finding)
    else:
        if kind is not None:
            _validate(loaded, kind, data)
    _bound_findings(loaded)
    return loaded


def load_manifest(path: str | os.PathLike[str]) -> Loaded:
    return _load_expecting(path, "manifest")


def load_profile(path: str | os.PathLike[str]) -> Loaded:
    return _load_expecting(path, "profile")


def load_host(path: str | os.PathLike[str]) -> Loaded:
    return _load_expecting(path, "host")


def load_fleet(path: str | os.PathLike[str]) -> Loaded:
    return _load_expecting(path, "fleet")


def _load_expecting(path: str | os.PathLike[str], kind: str) -> Loaded:
    loaded = load_document(path)
    if loaded.kind is not None and loaded.kind != kind and loaded.data is not None:
        loaded.findings.append(
            loaded.finding(
                "PWR012",
                f"expected a {kind} file here, but this is a {loaded.kind} (schema = {_toml(loaded.data['schema'])})",
                where="schema",
                hint=f"pass a file that starts with schema = \"{schema_id(kind)}\"",
            )
        )
        loaded.model = None
    return loaded


# --- reading and parsing ----------------------------------------------------------


# Why a file cannot be read or parsed -> (code, hint).
_READ_FAILURES = {
    Reason.MISSING: ("PWR001", "check the path (it is relative to the current directory)"),
    Reason.UNREADABLE: ("PWR013", "check the path and the file's permissions"),
    Reason.NOT_REGULAR: ("PWR002", "pass a .toml file (or, to `power validate`, a directory of them)"),
    Reason.TOO_LARGE: ("PWR003", "a manifest or profile is a few hundred bytes: check that this is the file you meant"),
    Reason.NOT_UTF8: ("PWR006", "save the file as UTF-8 (TOML files must be UTF-8)"),
    Reason.SYNTAX: ("PWR007", "see https://toml.io/en/v1.0.0 for the syntax; strings need quotes, tables [brackets]"),
    Reason.TOO_DEEP: ("PWR008", "flatten the nesting: no Power file nests more than three levels"),
    Reason.NUMBER: ("PWR016", "write the value in range (sizes take units: \"24 GiB\")"),
}


def _read(loaded: Loaded) -> str:
    """The file's text; _Unloadable with the finding that says why it cannot be read as text."""
    try:
        raw = read_bytes(loaded.path, MAX_TOML_BYTES)
        if not raw.strip():
            raise _Unloadable(_error(loaded, "PWR004", "is empty", _SCHEMA_HINT))
        if b"\x00" in raw:
            raise _Unloadable(_error(loaded, "PWR005", "is binary (it contains NUL bytes), not TOML text",
                                     "pass the .toml file, not a GGUF or other binary"))
        text = decode_utf8(raw).removeprefix("\ufeff")
    except DocumentError as err:
        raise _failed_document(loaded, err) from None
    loaded.sha256 = hashlib.sha256(raw).hexdigest()
    return text


def _parse(loaded: Loaded, text: str) -> dict[str, Any]:
    try:
        return parse_toml(text)
    except DocumentError as err:
        generated = _generated_json(text)
        if generated is None:
            raise _failed_document(loaded, err) from None
        return generated


def _generated_json(text: str) -> dict[str, Any] | None:
    """A JSON document Power wrote (a plan, a fleet lock, evidence), recognised by its `schema` so that it is named
    for what it is (PWR014), not reported as broken TOML; None for anything else."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        data = parse_json(text)
    except DocumentError:
        return None
    schema = data.get("schema") if isinstance(data, dict) else None
    match = _SCHEMA_VALUE.match(schema) if isinstance(schema, str) else None
    return data if match is not None and match["kind"] in GENERATED_KINDS else None


def _failed_document(loaded: Loaded, err: DocumentError) -> _Unloadable:
    code, hint = _READ_FAILURES[err.reason]
    if err.where is not None:
        return _Unloadable(loaded.finding(code, err.message, where=err.where, hint=hint))
    return _Unloadable(err.finding(code, loaded.path, hint))


def _read_kind(loaded: Loaded, data: dict[str, Any], text: str) -> str | None:
    """The kind to validate the file as; None when the file is not one (with the finding that says so, if any)."""
    value = data.get("schema")
    if value is None:
        first_line = text.splitlines()[0] if text.splitlines() else ""
        raise _Unloadable(_error(loaded, "PWR010", "has no `schema` key, so its kind (manifest, profile, host, fleet) "
                                 "is unknown", _SCHEMA_HINT, line=1, col=1, source_line=first_line))
    match = _SCHEMA_VALUE.match(value) if isinstance(value, str) else None
    if match is not None and match["kind"] in GENERATED_KINDS:
        loaded.kind = match["kind"]
        loaded.findings.append(
            loaded.finding(
                "PWR014",
                f"a {match['kind']} document that Power generated; it is checked where it is used, not here",
                where="schema",
                hint="validate the manifests, profiles, hosts and fleets it came from",
            )
        )
        return None
    if match is None or match["kind"] not in KIND_MODELS or match["version"] != SCHEMA_VERSION:
        loaded.findings.append(
            loaded.finding("PWR011", f"schema = {_toml(value)} is not a Power file kind", where="schema",
                           hint=_schema_value_hint(value))
        )
        return None
    loaded.kind = match["kind"]
    _check_editor_schema_line(loaded, text)
    return loaded.kind


def _check_editor_schema_line(loaded: Loaded, text: str) -> None:
    """A `#:schema` first line (taplo, Even Better TOML) must name this kind's JSON Schema."""
    directive = _EDITOR_SCHEMA.match(text)
    if directive is None:
        return
    named = directive["target"].rsplit("/", 1)[-1]
    if named != f"{loaded.kind}.json":
        loaded.findings.append(
            Finding(
                code="PWR015",
                severity=Severity.WARNING,
                message=f"the #:schema line names {named}, but this is a {loaded.kind} file: editors will check it "
                        "against the wrong schema",
                file=str(loaded.path),
                line=1,
                col=directive.start("target") + 1,
                end_col=directive.end("target") + 1,
                hint=f"point it at {loaded.kind}.json (`power schema {loaded.kind}`)",
                source_line=directive.group(0),
            )
        )


def _schema_value_hint(value: Any) -> str:
    known = [schema_id(kind) for kind in KIND_MODELS]
    close = difflib.get_close_matches(str(value), known, n=1, cutoff=0.6)
    if close:
        return f'did you mean schema = "{close[0]}"?'
    return "one of: " + ", ".join(f'"{k}"' for k in known)


# --- validation ------------------------------------------------------------------


def _validate(loaded: Loaded, kind: str, document: dict[str, Any]) -> None:
    """Unknown keys first (found by walking the models: one finding each, however many there are, costs
    no pydantic error), then the model on the data without them, then the cross-field rules."""
    model_type = KIND_MODELS[kind]
    unknown = _unknown_keys(model_type, document)
    data = _without(document, unknown)
    loaded.findings += [_unknown_key(loaded, model_type, path) for path in unknown[:MAX_FINDINGS_PER_FILE]]
    loaded.unlisted = max(0, len(unknown) - MAX_FINDINGS_PER_FILE)
    try:
        model = model_type.model_validate(data, context={"base_dir": loaded.path.absolute().parent})
    except ValidationError as exc:
        model = None
        loaded.findings += _schema_findings(loaded, model_type, exc, data)
    for issue in rules.check(kind, document):
        loaded.findings.append(loaded.finding(issue.code, issue.message, where=issue.where, hint=issue.hint,
                                              severity=issue.severity))
    loaded.model = None if has_errors(loaded.findings) else model


def _bound_findings(loaded: Loaded) -> None:
    """The findings in file order, at most MAX_FINDINGS_PER_FILE of them, then one that counts the rest."""
    loaded.findings.sort(key=lambda finding: (finding.line or 0, finding.col or 0))
    unlisted = loaded.findings[MAX_FINDINGS_PER_FILE:]
    count = len(unlisted) + loaded.unlisted
    if not count:
        return
    # Keys never listed are unknown keys: errors.
    errors = sum(f.is_error for f in unlisted) + loaded.unlisted
    del loaded.findings[MAX_FINDINGS_PER_FILE:]
    loaded.findings.append(Finding(
        code="PWR017", severity=Severity.ERROR if errors else Severity.WARNING, file=str(loaded.path),
        message=f"{count:,} more finding(s) in this file are not listed ({errors:,} of them errors); "
                f"only the first {MAX_FINDINGS_PER_FILE} are",
        hint="fix the findings listed and validate again; a file with this many is rarely the file you meant"))


def _unknown_keys(model_type: type[BaseModel], data: Any, here: KeyPath = ()) -> list[KeyPath]:
    """Every key in `data` that its model does not define, as a key path, in document order."""
    if not isinstance(data, dict):
        return []
    fields = {key: info for name, info in model_type.model_fields.items() for key in (name, info.alias or name)}
    found: list[KeyPath] = []
    for key, value in data.items():
        if key not in fields:
            found.append((*here, key))
            continue
        shape = _shape(fields[key].annotation)
        if shape is None:
            continue
        container, nested = shape
        if container == "one":
            found += _unknown_keys(nested, value, (*here, key))
        elif container == "list" and isinstance(value, list):
            for index, item in enumerate(value):
                found += _unknown_keys(nested, item, (*here, key, index))
        elif container == "dict" and isinstance(value, dict):
            for name, item in value.items():
                found += _unknown_keys(nested, item, (*here, key, name))
    return found


def _without(data: Any, paths: list[KeyPath]) -> Any:
    """`data` without the keys at `paths`: the containers on those paths are copied, all others shared."""
    if not paths or not isinstance(data, (dict, list)):
        return data
    removed = {path[0] for path in paths if len(path) == 1}
    deeper: dict[str | int, list[KeyPath]] = {}
    for path in paths:
        if len(path) > 1:
            deeper.setdefault(path[0], []).append(path[1:])
    if isinstance(data, list):
        return [_without(item, deeper[index]) if index in deeper else item for index, item in enumerate(data)]
    return {key: _without(value, deeper[key]) if key in deeper else value
            for key, value in data.items() if key not in removed}


def _schema_findings(loaded: Loaded, model_type: type[BaseModel], exc: ValidationError,
                     data: dict[str, Any]) -> list[Finding]:
    """One finding per offending key: pydantic reports a union's alternatives as several errors for one value."""
    by_path: dict[KeyPath, list[ErrorDetails]] = {}
    for error in exc.errors(include_url=False):
        by_path.setdefault(_data_path(error["loc"], data), []).append(error)
    paths = list(by_path)[:MAX_FINDINGS_PER_FILE]
    loaded.unlisted += len(by_path) - len(paths)
    return [_error_finding(loaded, model_type, path, by_path[path]) for path in paths]


def _error_finding(loaded: Loaded, model_type: type[BaseModel], path: KeyPath, errors: list[ErrorDetails]) -> Finding:
    where = format_where(path)
    key = path[-1] if path else ""
    kinds = {error["type"] for error in errors}
    if "missing" in kinds:
        table = format_where(path[:-1])
        return loaded.finding(
            "PWR021",
            f"missing required key `{where}`",
            where=path,
            hint=f"add `{key} = ...` to {f'[{table}]' if table else 'the top level'}: {_description(model_type, path)}",
            at="key",
        )
    size_errors = [e for e in errors if isinstance((e.get("ctx") or {}).get("error"), SizeError)]
    if size_errors:
        return loaded.finding("PWR023", f"{where}: {size_errors[0]['ctx']['error']}", where=path,
                              hint=f"write {ACCEPTED_FORMS}")
    value = errors[0].get("input")
    if key in ("sha256", "target_sha256") and "string_pattern_mismatch" in kinds:
        return loaded.finding(
            "PWR024",
            f"{where} = {_toml(value)} is not a sha256 digest",
            where=path,
            hint="write the 64 hexadecimal digits printed by `sha256sum FILE`",
        )
    reasons = _joined_reasons([error["msg"] for error in errors])
    return loaded.finding(
        _FIELD_CODES.get(key, "PWR022") if isinstance(key, str) else "PWR022",
        f"{where} = {_toml(value)}: {reasons}",
        where=path,
        hint=_value_hint(model_type, path, value),
    )


def _unknown_key(loaded: Loaded, model_type: type[BaseModel], path: KeyPath) -> Finding:
    key = str(path[-1])
    allowed = _allowed_keys(model_type, path[:-1])
    table = format_where(path[:-1])
    place = f"[{table}]" if table else "the top level"
    renamed = RENAMED_KEYS.get(key)
    if renamed in allowed:
        return loaded.finding(
            "PWR026", f"`{key}` is not Power's name for this setting", where=path,
            hint=f"rename `{key}` to `{renamed}`", at="key"
        )
    home = _table_holding(model_type, path[:-1], renamed) if renamed else None
    if home is not None:
        return loaded.finding(
            "PWR026", f"`{key}` is not Power's name for this setting, nor is it set at {place}", where=path,
            hint=f"set `{renamed}` in [{home}] instead", at="key"
        )
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    hint = f"did you mean `{close[0]}`?" if close else f"allowed keys in {place}: {', '.join(sorted(allowed))}"
    return loaded.finding("PWR020", f"unknown key `{key}` in {place}", where=path, hint=hint, at="key")


def _value_hint(model_type: type[BaseModel], path: KeyPath, value: Any) -> str:
    if isinstance(value, str) and value in modes.LLAMA_SPELLINGS:
        return f'"{value}" is llama.cpp\'s --spec-type name; Power calls it "{modes.LLAMA_SPELLINGS[value]}"'
    return f"{path[-1]}: {_description(model_type, path)}" if path else _SCHEMA_HINT


# --- walking the models along a key path -------------------------------------------


def _data_path(loc: tuple[Any, ...], data: Any) -> KeyPath:
    """The part of a pydantic error location that names places in the data (drops union tags)."""
    path: list[str | int] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and isinstance(part, str):
            path.append(part)
            if part not in node:
                break
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            path.append(part)
            node = node[part]
        else:
            break
    return tuple(path)


def _model_at(model_type: type[BaseModel], path: KeyPath) -> type[BaseModel] | None:
    """The model class that describes the table at `path` (list indices and dict keys are stepped over)."""
    current: type[BaseModel] | None = model_type
    keyed = False
    for part in path:
        if isinstance(part, int) or keyed:
            keyed = False
            continue
        field_info = _field(current, part) if current else None
        shape = _shape(field_info.annotation) if field_info else None
        current = shape[1] if shape else None
        keyed = shape is not None and shape[0] == "dict"
    return current


def _field(model_type: type[BaseModel], key: str):
    for name, info in model_type.model_fields.items():
        if (info.alias or name) == key:
            return info
    return None


def _shape(annotation: Any) -> tuple[str, type[BaseModel]] | None:
    """How a field holds a model: ("one" | "list" | "dict", the model), through Optional, unions and Annotated."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "one", annotation
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (list, tuple) and args:
        inner = _shape(args[0])
        return ("list", inner[1]) if inner and inner[0] == "one" else None
    if origin is dict and len(args) == 2:
        inner = _shape(args[1])
        return ("dict", inner[1]) if inner and inner[0] == "one" else None
    for arg in args:
        found = _shape(arg)
        if found is not None:
            return found
    return None


def _table_holding(model_type: type[BaseModel], table: KeyPath, key: str) -> str | None:
    """The table directly under `table` whose keys include `key` (a renamed setting written one level too high)."""
    for name in _allowed_keys(model_type, table):
        model = _model_at(model_type, (*table, name))
        if model is not None and model is not _model_at(model_type,
                                                        table) and key in _allowed_keys(model_type, (*table, name)):
            return format_where((*table, name))
    return None


def _allowed_keys(model_type: type[BaseModel], table: KeyPath) -> list[str]:
    model = _model_at(model_type, table)
    return [info.alias or name for name, info in model.model_fields.items()] if model else []


def _description(model_type: type[BaseModel], path: KeyPath) -> str:
    model = _model_at(model_type, path[:-1])
    info = _field(model, str(path[-1])) if model and path else None
    return (info.description or "see `power schema`") if info else "see `power schema`"


# --- small helpers ------------------------------------------------------------------


class _Unloadable(Exception):
    """Loading stops at this finding: the file cannot be read, decoded or parsed, or names no kind."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(finding.message)
        self.finding = finding


def _error(loaded: Loaded, code: str, message: str, hint: str, *,
           line: int | None = None, col: int | None = None, source_line: str | None = None) -> Finding:
    """An error finding for this file, placed at line:col when given."""
    return Finding(code=code, severity=Severity.ERROR, message=message, file=str(loaded.path), line=line, col=col,
                   hint=hint, source_line=source_line)


def _toml(value: Any, limit: int = 60) -> str:
    """A value as the message quotes it: JSON-like, cut to `limit` characters."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _joined_reasons(messages: list[str]) -> str:
    """pydantic's "Input should be X" messages for one value, as "input should be X or Y"."""
    prefix = "Input should be "
    unique = list(dict.fromkeys(messages))
    if len(unique) > 1 and all(message.startswith(prefix) for message in unique):
        unique = [unique[0]] + [message.removeprefix(prefix) for message in unique[1:]]
    text = " or ".join(unique)
    return text[:1].lower() + text[1:]
