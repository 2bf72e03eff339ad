"""`power import`: an existing engine launch turned into a Power manifest + profile, with findings.

The engine-neutral half of the import: the engine's own reader
(`power.orchestrator.engines.<engine>.reader`, named by its adapter's
`launch_reader`) reads the located words into a LaunchSpec with the launch-line
mistakes that cost speculation silently or kill the server at start; this module
drops the program word, reports what every engine shares, and writes the
documents. The codes:

- PWR440 a word llama-server does not know (it stops: `error: invalid argument: X`)
- PWR441 an option without its value (it stops: `expected value for argument`)
- PWR442 a `$VAR` in a unit's ExecStart that the unit does not define (systemd expands it to nothing)
- PWR443 an engine-prefixed variable the engine does not read (ignored, silently)
- PWR450 `--spec-type mtp`: the pre-rename spelling; llama.cpp no longer knows it and runs without speculation
- PWR451 `-md`/`--spec-draft-model` without `--spec-type` (the drafter's role is left to a guess), or with
  a `--spec-type` list that names no drafter to run it (it is never used)
- PWR452 two context-backed types in one `--spec-type` list: they need one draft context each and cannot share a process
- PWR453 a drafter whose header declares no sliding window at a large context: its KV spans the whole context
- PWR454 a removed option (`--draft-max`, `--spec-ngram-size-n`, ...), given as a flag or as its variable
  (`LLAMA_ARG_DRAFT_MAX`): llama-server stops at start with the error it prints, quoted
- PWR455 a speculative type nobody (or Power) knows
- PWR456 removed vLLM flags; PWR457 a `--speculative-config` that is not a JSON object
- PWR458 no model on the line
- PWR444/PWR446/PWR447 an option Power does not carry (each engine's `options` table says, for each option, whether
  it is carried, refused with its fix, or of no effect on the plan); PWR445 a V cache type other than the K type

A finding about a written document (which is never written when it has an error) is told at the launch line
(`on_the_line`): at the option that set the key, or with the flag to add where the line left it to the default.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Callable

from power import modes
from power.artifacts import contracts
from power.artifacts.bounded_reader import is_regular_file
from power.artifacts.facts import ArtifactError, inspect_artifact
from power.findings import Finding, Severity
from power.orchestrator.engines import IMPORTABLE, adapter
from power.orchestrator.inputs.launch_lines.spec import LaunchSpec, finding, runs_a_file, sidecar
from power.orchestrator.inputs.launch_lines.tokens import EnvNames, Token
from power.orchestrator.inputs.units import format_size


def env_names(engine: str) -> EnvNames | None:
    """The variables an engine reads as options (`LLAMA_ARG_CTX_SIZE` is `--ctx-size`); vLLM has no such convention."""
    return adapter(engine).env_names()


# A drafter without a window at this context or more caches enough KV to matter (DSpark: 5 GiB at 262144).
LARGE_CONTEXT = 32768


@dataclass
class ImportResult:
    spec: LaunchSpec
    findings: list[Finding]


def import_launch(engine: str, tokens: list[Token]) -> ImportResult:
    """Read a launch line (tokens already located) into a LaunchSpec and its findings."""
    tokens = _without_program(engine, tokens)
    findings = [_unresolved(token) for token in tokens if token.unresolved]
    tokens = [token for token in tokens if token.text or not token.unresolved]  # an undefined `$VAR` word is no word
    spec, read = _reader(engine)(tokens)
    spec.start = tokens[0] if tokens else None
    findings += read
    if spec.model is None:
        findings.append(finding("PWR458", tokens[0] if tokens else None,
                                 "the launch line names no local model file",
                                 "pass the target GGUF with -m PATH (an -hf repository cannot be checked offline)"))
    findings += _window_findings(spec)
    findings.sort(key=lambda f: (f.file or "", f.line or 0, f.col or 0))
    return ImportResult(spec, findings)


def _reader(engine: str) -> Callable[[list[Token]], tuple[LaunchSpec, list[Finding]]]:
    """The engine's launch-line reader; KeyError for an engine with none (the command offers only `IMPORTABLE`)."""
    reader = adapter(engine).launch_reader
    if reader is None:
        raise KeyError(f"{engine} has no launch line to import; importable: {', '.join(IMPORTABLE)}")
    return reader


def _without_program(engine: str, tokens: list[Token]) -> list[Token]:
    """Drop the program name (`llama-server`, `vllm serve`, `python -m vllm.entrypoints...`) when present."""
    environment = [token for token in tokens if token.env is not None]
    rest = [token for token in tokens if token.env is None]
    while rest and not rest[0].text.startswith("-") and adapter(engine).program_word(rest[0].text):
        rest.pop(0)
    return environment + rest


def _unresolved(token: Token) -> Finding:
    return finding("PWR442", token, f"${token.unresolved} is not defined by the unit (no Environment= or "
                    f"EnvironmentFile= sets it): systemd expands it to nothing, so the engine never sees this word",
                    f"define {token.unresolved} in the unit, or write the value itself", Severity.WARNING)


def _window_findings(spec: LaunchSpec) -> list[Finding]:
    """PWR453: the drafter's header declares no sliding window and the context is large."""
    if spec.draft_model is None or spec.ctx is None or spec.ctx < LARGE_CONTEXT:
        return []
    path = Path(spec.draft_model.text)
    if not is_regular_file(path):
        return _window_by_contract(spec)
    try:
        facts = inspect_artifact(path)
    except ArtifactError as err:
        return [err.finding]
    if facts.sliding_window is not None:
        return []
    per_position = facts.drafter_kv_bytes_per_position
    return [finding(
        "PWR453", spec.draft_model,
        f"the drafter {path.name} declares no sliding window, so its KV caches all {spec.ctx:,} positions of the "
        f"context ({format_size(per_position * spec.ctx)} at {format_size(per_position)} per position)",
        "budget that memory on the draft device (`power size`), shorten the context, or use a drafter that "
        "declares attention.sliding_window", severity=Severity.WARNING)]


def _window_by_contract(spec: LaunchSpec) -> list[Finding]:
    """Without the file, the DSpark contract still says it: DSpark headers carry no sliding-window key."""
    if spec.mode != modes.DSPARK or "attention.sliding_window" in contracts.REQUIRED_KEYS[modes.DSPARK]:
        return []
    return [finding(
        "PWR453", spec.draft_model,
        f"DSpark drafters declare no sliding window (the contract has none), so its KV caches all {spec.ctx:,} "
        f"positions of the context (the Qwen3.6-27B DSpark: 20 KiB per position, 5.00 GiB at 262,144)",
        "budget that memory on the draft device (`power size`), or shorten the context; run the import where the "
        "file is to get the exact figure", severity=Severity.WARNING)]


def manifest_document(spec: LaunchSpec, out_dir: Path, sha256_of: Callable[[Path], str]) -> dict[str, Any]:
    """The manifest for the launch's model and drafters; paths relative to `out_dir`, where it will be written."""
    if spec.model is None:
        raise ValueError("a launch without a model has no manifest (PWR458 says so first)")
    target = Path(spec.model.text).absolute()
    target_sha = sha256_of(target)
    drafters: list[dict[str, Any]] = []
    if spec.draft_model is not None and (runs_a_file(spec.mode) or sidecar(spec.mode)):
        path = Path(spec.draft_model.text).absolute()
        drafters.append({"kind": spec.mode, "path": os.path.relpath(path, out_dir), "target_sha256": target_sha,
                         **(_checkpoint_files(path, sha256_of) if path.is_dir() else
                            {"size": path.stat().st_size, "sha256": sha256_of(path)})})
    elif spec.mode != modes.NONE and modes.mode(spec.mode).artifact == "target":
        drafters.append({"kind": spec.mode})
    drafters += [{"kind": kind} for kind in spec.chain if kind in modes.WEIGHT_FREE]
    return {
        "schema": "power.manifest/v1",
        "name": target.stem,
        "description": f"imported from a {spec.engine} launch line",
        "target": {"path": os.path.relpath(target, out_dir), "size": target.stat().st_size, "sha256": target_sha},
        "drafters": drafters,
    }


def _checkpoint_files(folder: Path, sha256_of: Callable[[Path], str]) -> dict[str, Any]:
    """A drafter given as a checkpoint folder (what vLLM's `model` names): each of its files with its size and
    sha256, by its path inside the folder (hidden files and folders, such as a download cache, left out)."""
    files = sorted(path for path in folder.rglob("*") if path.is_file()
                   and not any(part.startswith(".") for part in path.relative_to(folder).parts))
    return {"files": [{"name": path.relative_to(folder).as_posix(), "size": path.stat().st_size,
                       "sha256": sha256_of(path)} for path in files]}


def profile_document(spec: LaunchSpec) -> dict[str, Any]:
    """The profile the launch line amounts to, every setting as the engine runs it (its defaults filled in by its
    reader).

    llama.cpp keeps one rollback point per drafted token, so S = K.
    """
    k = spec.k or spec.unstated_k
    ngram = {}
    if any(kind in modes.WEIGHT_FREE for kind in spec.chain):
        ngram = {"ngram_match": spec.ngram_match, "ngram_draft_min": max(1, spec.ngram_draft_min or 1),
                 "ngram_draft_max": spec.ngram_draft_max if spec.ngram_draft_max != k else None}
    runtime = {key: value for key, value in (
        ("ctx", spec.ctx), ("slots", spec.slots), ("kv_unified", spec.kv_unified), ("batch", spec.batch),
        ("ubatch", spec.ubatch), ("flash_attn", spec.flash_attn), ("kv_cache_type", spec.kv_cache_type),
        *ngram.items()) if value is not None}
    sampling = {key: value for key, value in (("temperature", spec.temperature), ("seed", spec.seed))
                if value is not None}
    runtime |= _placement(spec)
    settings = {"spec_draft_p_min": spec.p_min} if spec.p_min is not None else {}
    return {
        "schema": "power.profile/v1",
        "name": f"imported-{spec.engine}-{spec.mode}",
        "description": f"imported from a {spec.engine} launch line",
        "spec_mode": spec.mode,
        "engine": spec.engine,
        "spec_draft_max": k,
        "spec_mtp_recurrent_snapshots": k,
        **settings,
        "runtime": runtime,
        "sampling": sampling,
    }


def _placement(spec: LaunchSpec) -> dict[str, Any]:
    """Offload and split, and where the drafter runs and in which cache type (where it differs from the target's)."""
    return {key: value for key, value in (
        ("gpu_layers", spec.gpu_layers), ("split_mode", spec.split_mode), ("tensor_split", spec.tensor_split),
        ("main_gpu", spec.main_gpu), ("draft_device", spec.draft_device), ("draft_gpu_layers", spec.draft_gpu_layers),
        ("tensor_parallel", spec.tensor_parallel), ("cuda_graphs", spec.cuda_graphs),
        ("draft_override_tensor", spec.draft_override_tensor), ("draft_kv_cache_type", spec.draft_kv_cache_type),
    ) if value is not None}


# The written documents' keys -> the LaunchSpec field they hold (`profile_document`, `manifest_document`).
_FIELD_OF_KEY = {
    **{f"runtime.{key}": key for key in (
        "ctx", "slots", "kv_unified", "batch", "ubatch", "flash_attn", "kv_cache_type", "ngram_match",
        "ngram_draft_min", "ngram_draft_max", "gpu_layers", "split_mode", "tensor_split", "main_gpu", "draft_device",
        "draft_gpu_layers", "draft_kv_cache_type", "tensor_parallel", "cuda_graphs", "draft_override_tensor")},
    "sampling.temperature": "temperature", "sampling.seed": "seed", "spec_draft_max": "k",
    "spec_mtp_recurrent_snapshots": "k", "spec_draft_p_min": "p_min", "spec_mode": "spec_type", "target": "model",
    "drafters": "draft_model",
}
_MANIFEST_KEYS = {"target", "drafters"}


def on_the_line(finding: Finding, spec: LaunchSpec) -> Finding:
    """A finding about a written document (which is never written when it has an error), told at the launch line:
    at the option that set the key, its keys named as the engine's flags; where the line leaves the key to the
    engine's default, at the line's start, with the flag to add."""
    key = _key_of(finding.where)
    field = _FIELD_OF_KEY.get(key or "")
    if field == "draft_model" and field not in spec.given:  # a drafter the line names by its type alone
        field = "spec_type"
    flags = _flags(spec.engine) | ({"k": _flags(spec.engine)["ngram_draft_max"]} if spec.mode in modes.WEIGHT_FREE
                                   else {})
    named = [spec.given[f] for k, f in _FIELD_OF_KEY.items() if f in spec.given and k.rsplit(".", 1)[-1] in
             finding.message]
    token = spec.given.get(field or "") or next(iter(named), spec.start)
    message, hint = _in_flags(finding.message, flags), _in_flags(finding.hint or "", flags)
    if field is not None and field not in spec.given and field in flags and key not in _MANIFEST_KEYS:
        message += f" ({flags[field]} is not on the line: {_default_of(spec.engine, flags[field])} applies)"
        hint = f"add {flags[field]} N to the line: {hint}" if hint else f"add {flags[field]} N to the line"
    if token is None:
        return dataclasses.replace(finding, message=message, hint=hint or None)
    return dataclasses.replace(finding, message=message, hint=hint or None, file=token.file, line=token.line,
                               col=token.col, end_col=token.col + len(token.text) if token.env is None else None,
                               source_line=token.source_line, where=None)


def _default_of(engine: str, flag: str) -> str:
    """`llama.cpp's default 48` where the engine states its default; else `the engine's default`."""
    return adapter(engine).stated_default(flag) or "the engine's default"


def _key_of(where: str | None) -> str | None:
    """`runtime.ngram_draft_min` as is; `drafters[0].sha256` -> `drafters`; `target.path` -> `target`."""
    if where is None:
        return None
    head = where.split("[", 1)[0]
    return head if head in _FIELD_OF_KEY else head.split(".", 1)[0]


@cache
def _flags(engine: str) -> dict[str, str]:
    """Each LaunchSpec field -> the flag the engine reads it from (its settings table)."""
    settings = adapter(engine).settings
    return {entry.field: entry.flag for entry in settings.entries if entry.flag is not None}


def _in_flags(text: str, flags: dict[str, str]) -> str:
    """The documents' key names in `text` as the flags that set them (`ngram_draft_min` -> `--spec-ngram-mod-n-min`)."""
    for key, held in _FIELD_OF_KEY.items():
        name = key.rsplit(".", 1)[-1]
        if held in flags and name not in _MANIFEST_KEYS:
            text = re.sub(rf"(?<![\w.-])(runtime\.|sampling\.)?{name}\b", flags[held], text)
    return text
