"""`power import`: an existing llama-server or vLLM launch turned into a Power manifest + profile, with findings.

The findings are the launch-line mistakes that cost speculation silently or
kill the server at start (flag names as in llama.cpp's `common/arg.cpp` and
`docs/speculative.md`, vLLM's `--speculative-config`):

- PWR450 `--spec-type mtp`: the pre-rename spelling; llama.cpp no longer knows it and runs without speculation
- PWR451 `-md`/`--spec-draft-model` without `--spec-type` (the drafter's role is left to a guess), or with
  a `--spec-type` list that names no drafter to run it (it is never used)
- PWR452 two context-backed types in one `--spec-type` list: they need one draft context each and cannot share a process
- PWR453 a drafter whose header declares no sliding window at a large context: its KV spans the whole context
- PWR454 removed `--draft*` spellings (`--draft-max` ...): llama-server rejects them at start (as env vars they are ignored)
- PWR455 a speculative type nobody (or Power) knows
- PWR456 removed vLLM speculative flags; PWR457 a `--speculative-config` that is not a JSON object
- PWR458 no model on the line
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from power import modes
from power.artifacts import contracts
from power.artifacts.documents import DocumentError, parse_json
from power.artifacts.facts import ArtifactError, inspect_artifact
from power.findings import Finding, Severity
from power.orchestrator.launch_tokens import Token
from power.orchestrator.units import format_size

LLAMA_SERVER = "llama-server"
VLLM = "vllm"
# Env variables that stand for flags (`LLAMA_ARG_CTX_SIZE` is `--ctx-size`); vLLM has no such convention.
ENV_PREFIX: dict[str, str | None] = {LLAMA_SERVER: "LLAMA_ARG_", VLLM: None}

# llama-server: every spelling of the flags the import reads -> one canonical name.
LLAMA_ALIASES = {
    "-m": "--model", "--model": "--model",
    "-hf": "--hf-repo", "--hf-repo": "--hf-repo",
    "-c": "--ctx-size", "--ctx-size": "--ctx-size",
    "--spec-type": "--spec-type",
    "-md": "--spec-draft-model", "--spec-draft-model": "--spec-draft-model", "--model-draft": "--spec-draft-model",
    "-hfd": "--spec-draft-hf", "--spec-draft-hf": "--spec-draft-hf",
    "--spec-draft-n-max": "--spec-draft-n-max",
    "--spec-draft-n-min": "--spec-draft-n-min",
    "-ctk": "--cache-type-k", "--cache-type-k": "--cache-type-k",
    "-ctkd": "--spec-draft-type-k", "--spec-draft-type-k": "--spec-draft-type-k", "--cache-type-k-draft": "--spec-draft-type-k",
    "-fa": "--flash-attn", "--flash-attn": "--flash-attn",
    "-devd": "--spec-draft-device", "--spec-draft-device": "--spec-draft-device", "--device-draft": "--spec-draft-device",
    "--spec-ngram-size-n": "--spec-ngram-size-n", "--spec-ngram-size-m": "--spec-ngram-size-m",
    "-s": "--seed", "--seed": "--seed",
    "--temp": "--temp",
}
# Flags that take no value (everything else the import does not know is assumed to take one when one follows).
LLAMA_SWITCHES = {"--jinja", "--no-mmap", "--mlock", "--metrics", "--no-webui", "--cont-batching", "--no-warmup",
                  "--kv-unified", "--no-kv-offload", "--verbose", "-v", "--embedding", "--slots", "--no-slots"}
REMOVED_DRAFT_FLAGS = {
    "--draft": "--spec-draft-n-max", "--draft-n": "--spec-draft-n-max", "--draft-max": "--spec-draft-n-max",
    "--draft-n-max": "--spec-draft-n-max", "--draft-min": "--spec-draft-n-min", "--draft-n-min": "--spec-draft-n-min",
    "-cd": None, "--ctx-size-draft": None,
}
# llama.cpp `--spec-type` values of context-backed drafters -> Power's mode (None: no Power adapter).
CONTEXT_BACKED: dict[str, str | None] = {
    spelling: kind for spelling, kind in modes.BY_LLAMA_SPEC_TYPE.items() if kind in modes.CONTEXT_BACKED
} | dict.fromkeys(modes.FOREIGN_LLAMA_SPEC_TYPES)
# `--spec-type` values that need no drafter: no speculation, or a weight-free n-gram kind.
DRAFTLESS = {modes.LLAMA_NO_SPECULATION} | {
    spelling for spelling, kind in modes.BY_LLAMA_SPEC_TYPE.items() if kind in modes.WEIGHT_FREE}
LLAMA_DEFAULT_N_MAX = 3

VLLM_REMOVED = {"--speculative-model", "--num-speculative-tokens", "--speculative-draft-tensor-parallel-size",
                "--speculative-max-model-len", "--speculative-disable-by-batch-size", "--ngram-prompt-lookup-max",
                "--ngram-prompt-lookup-min", "--speculative-disable-mqa-scorer", "--spec-decoding-acceptance-method"}

# A drafter without a window at this context or more caches enough KV to matter (DSpark: 5 GiB at 262144).
LARGE_CONTEXT = 32768


@dataclass
class LaunchSpec:
    """What the launch line asks for, in Power's terms."""

    engine: str
    model: Token | None = None
    draft_model: Token | None = None
    mode: str = modes.NONE
    chain: list[str] = field(default_factory=list)
    k: int | None = None
    ctx: int | None = None
    kv_cache_type: str | None = None
    draft_kv_cache_type: str | None = None
    flash_attn: bool | None = None
    seed: int | None = None
    temperature: float | None = None


@dataclass
class ImportResult:
    spec: LaunchSpec
    findings: list[Finding]


def import_launch(engine: str, tokens: list[Token]) -> ImportResult:
    """Read a launch line (tokens already located) into a LaunchSpec and its findings."""
    tokens = _without_program(engine, tokens)
    if engine == LLAMA_SERVER:
        spec, findings = _read_llama_server(tokens)
    else:
        spec, findings = _read_vllm(tokens)
    if spec.model is None:
        findings.append(_finding("PWR458", tokens[0] if tokens else None,
                                 "the launch line names no local model file",
                                 "pass the target GGUF with -m PATH (an -hf repository cannot be checked offline)"))
    findings += _window_findings(spec)
    findings.sort(key=lambda f: (f.file or "", f.line or 0, f.col or 0))
    return ImportResult(spec, findings)


def _without_program(engine: str, tokens: list[Token]) -> list[Token]:
    """Drop the program name (`llama-server`, `vllm serve`, `python -m vllm.entrypoints...`) when present."""
    rest = list(tokens)
    while rest and not rest[0].text.startswith("-") and _is_program_word(engine, rest[0].text):
        rest.pop(0)
    return rest


def _is_program_word(engine: str, word: str) -> bool:
    name = Path(word).name
    if engine == LLAMA_SERVER:
        return name in {"llama-server", "server"} or name.startswith("llama-server")
    return name in {"vllm", "serve", "python", "python3", "-m"} or name.startswith("vllm.entrypoints")


def _pairs(tokens: list[Token], switches: set[str]) -> list[tuple[Token, Token | None]]:
    """(flag, value) pairs; `--flag=value` split; a flag followed by another flag has no value."""
    pairs: list[tuple[Token, Token | None]] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token.text.startswith("-") and "=" in token.text and token.text.startswith("--"):
            flag, value = token.text.split("=", 1)
            pairs.append((_retext(token, flag), _retext(token, value, shift=len(flag) + 1)))
            index += 1
            continue
        following = tokens[index + 1] if index + 1 < len(tokens) else None
        takes_value = token.text not in switches and following is not None and (
            not following.text.startswith("-") or _is_number(following.text))
        pairs.append((token, following if takes_value else None))
        index += 2 if takes_value else 1
    return pairs


def _read_llama_server(tokens: list[Token]) -> tuple[LaunchSpec, list[Finding]]:
    spec, findings = LaunchSpec(LLAMA_SERVER), []
    spec_type: Token | None = None
    for flag, value in _pairs(tokens, LLAMA_SWITCHES):
        if flag.text in REMOVED_DRAFT_FLAGS:
            findings.append(_removed_draft_flag(flag))
            continue
        name = LLAMA_ALIASES.get(flag.text)
        if name is None or value is None:
            continue
        if name == "--model":
            spec.model = value
        elif name == "--spec-draft-model":
            spec.draft_model = value
        elif name == "--spec-type":
            spec_type = value
        elif name == "--spec-draft-n-max":
            spec.k = _int(value, findings)
        elif name == "--ctx-size":
            spec.ctx = _int(value, findings)
        elif name == "--cache-type-k":
            spec.kv_cache_type = value.text
        elif name == "--spec-draft-type-k":
            spec.draft_kv_cache_type = value.text
        elif name == "--flash-attn":
            spec.flash_attn = value.text.lower() in {"on", "1", "true", "yes"}
        elif name == "--seed":
            spec.seed = _int(value, findings)
        elif name == "--temp":
            spec.temperature = float(value.text) if _is_number(value.text) else None
    if spec_type is None:
        if spec.draft_model is not None:
            findings.append(_finding(
                "PWR451", spec.draft_model,
                f"a draft model ({spec.draft_model.text}) is given without --spec-type",
                "say what the drafter is: --spec-type draft-mtp | draft-dflash | draft-dspark | draft-simple "
                "(Power fails closed rather than guessing the drafter's contract)"))
    else:
        findings += _read_spec_types(spec, spec_type)
        if spec.draft_model is not None and not _runs_a_file(spec.mode) and not findings:
            findings.append(_finding(
                "PWR451", spec.draft_model,
                f"a draft model ({spec.draft_model.text}) is given, but --spec-type {spec_type.text} names no "
                "drafter that runs one: it is never used",
                "add the drafter's type to the list (e.g. --spec-type draft-dflash,ngram-mod), or drop -md"))
    if spec.mode != modes.NONE and spec.k is None:
        spec.k = LLAMA_DEFAULT_N_MAX
    return spec, findings


def _read_spec_types(spec: LaunchSpec, value: Token) -> list[Finding]:
    findings, drafters = [], []
    names = [name.strip() for name in value.text.split(",") if name.strip()]
    for name in names:
        if name in modes.LLAMA_RETIRED:
            code = "PWR450" if name == modes.MTP else "PWR455"
            findings.append(_finding(
                code, value,
                f"--spec-type {name} is the pre-rename spelling: current llama.cpp does not know it and serves "
                "without speculation, silently",
                f"use --spec-type {modes.LLAMA_RETIRED[name]} (renamed in May 2026, llama.cpp b9180+)"))
        elif name in CONTEXT_BACKED:
            drafters.append(name)
        elif name in DRAFTLESS:
            if name != modes.LLAMA_NO_SPECULATION:
                spec.chain.append(modes.BY_LLAMA_SPEC_TYPE[name])
        else:
            findings.append(_finding("PWR455", value, f"unknown speculative type {name!r}",
                                     "known: " + ", ".join(sorted(DRAFTLESS | set(CONTEXT_BACKED)))))
    if len(drafters) > 1:
        findings.append(_finding(
            "PWR452", value,
            f"{' and '.join(drafters)} are both context-backed drafters: each needs its own draft context, so they "
            "cannot share one process (llama.cpp dies at load)",
            "keep one context-backed drafter; weight-free ngram types may chain with it "
            "(e.g. --spec-type draft-dflash,ngram-mod)"))
    if drafters:
        mode = CONTEXT_BACKED[drafters[0]]
        if mode is None:
            findings.append(_finding("PWR455", value, f"Power has no adapter for {drafters[0]}",
                                     "plan it as draft-mtp, draft-dflash or draft-dspark, or keep it outside Power"))
        else:
            spec.mode = mode
            spec.chain.append(mode)
    elif spec.chain:
        spec.mode = spec.chain[0]
    return findings


def _read_vllm(tokens: list[Token]) -> tuple[LaunchSpec, list[Finding]]:
    spec, findings = LaunchSpec(VLLM), []
    if tokens and not tokens[0].text.startswith("-"):
        spec.model = tokens[0]
        tokens = tokens[1:]
    config: tuple[Token, dict[str, Any]] | None = None
    for flag, value in _pairs(tokens, {"--trust-remote-code", "--enforce-eager", "--enable-prefix-caching"}):
        if flag.text in VLLM_REMOVED:
            findings.append(_finding("PWR456", flag, f"{flag.text} was removed from vLLM",
                                     "pass the drafter through --speculative-config "
                                     "'{\"method\": ..., \"model\": ..., \"num_speculative_tokens\": N}'"))
        elif value is None:
            continue
        elif flag.text == "--model":
            spec.model = value
        elif flag.text == "--max-model-len":
            spec.ctx = _int(value, findings)
        elif flag.text == "--kv-cache-dtype":
            spec.kv_cache_type = value.text
        elif flag.text == "--seed":
            spec.seed = _int(value, findings)
        elif flag.text == "--speculative-config":
            parsed = _json_object(value, findings)
            if parsed is not None:
                config = (value, parsed)
        elif flag.text in {"--spec-method", "--spec-model", "--spec-tokens"}:
            key = {"--spec-method": "method", "--spec-model": "model", "--spec-tokens": "num_speculative_tokens"}
            config = config or (value, {})
            config[1][key[flag.text]] = value.text
    if config is not None:
        findings += _read_vllm_config(spec, *config)
    return spec, findings


def _read_vllm_config(spec: LaunchSpec, where: Token, config: dict[str, Any]) -> list[Finding]:
    method = str(config.get("method", ""))
    if method in modes.FOREIGN_VLLM_METHODS:
        return [_finding("PWR455", where, f"Power has no adapter for the vLLM method {method!r}",
                         "plan it as mtp, dflash, dspark or ngram, or keep it outside Power")]
    if method not in modes.BY_VLLM_METHOD:
        return [_finding("PWR455", where, f"unknown speculative method {method!r} in --speculative-config",
                         "known: " + ", ".join(sorted(modes.BY_VLLM_METHOD)))]
    spec.mode = modes.BY_VLLM_METHOD[method]
    spec.chain = [spec.mode]
    findings: list[Finding] = []
    tokens = config.get("num_speculative_tokens")
    spec.k = None if tokens is None else _int(_retext(where, str(tokens)), findings)
    if config.get("model") and _runs_a_file(spec.mode):
        spec.draft_model = _retext(where, str(config["model"]))
    return findings


def _window_findings(spec: LaunchSpec) -> list[Finding]:
    """PWR453: the drafter's header declares no sliding window and the context is large."""
    if spec.draft_model is None or spec.ctx is None or spec.ctx < LARGE_CONTEXT:
        return []
    path = Path(spec.draft_model.text)
    if not path.is_file():
        return _window_by_contract(spec)
    try:
        facts = inspect_artifact(path)
    except ArtifactError as err:
        return [err.finding]
    if facts.sliding_window is not None:
        return []
    per_position = facts.drafter_kv_bytes_per_position
    return [_finding(
        "PWR453", spec.draft_model,
        f"the drafter {path.name} declares no sliding window, so its KV caches all {spec.ctx:,} positions of the "
        f"context ({format_size(per_position * spec.ctx)} at {format_size(per_position)} per position)",
        "budget that memory on the draft device (`power size`), shorten the context, or use a drafter that "
        "declares attention.sliding_window", severity=Severity.WARNING)]


def _window_by_contract(spec: LaunchSpec) -> list[Finding]:
    """Without the file, the DSpark contract still says it: DSpark headers carry no sliding-window key."""
    if spec.mode != contracts.DSPARK or "attention.sliding_window" in contracts.REQUIRED_KEYS[contracts.DSPARK]:
        return []
    return [_finding(
        "PWR453", spec.draft_model,
        f"DSpark drafters declare no sliding window (the contract has none), so its KV caches all {spec.ctx:,} "
        f"positions of the context (the Qwen3.6-27B DSpark: 20 KiB per position, 5.00 GiB at 262,144)",
        "budget that memory on the draft device (`power size`), or shorten the context; run the import where the "
        "file is to get the exact figure", severity=Severity.WARNING)]


def _runs_a_file(mode: str) -> bool:
    """Whether the mode runs a drafter given by file (`-md`, or `model` in vLLM's config)."""
    return mode != modes.NONE and modes.mode(mode).file_backed


def _removed_draft_flag(flag: Token) -> Finding:
    replacement = REMOVED_DRAFT_FLAGS[flag.text]
    if flag.env is not None:
        message = f"{flag.env} is the env name of the removed {flag.text}: llama-server ignores it, silently"
    else:
        message = f"{flag.text} was removed: llama-server stops at start with `error: invalid argument: {flag.text}`"
    hint = (f"use {replacement}" if replacement else
            "drop it: the draft context is built at the target's context size; budget drafter KV with `power size`")
    return _finding("PWR454", flag, message, hint)


def _finding(code: str, token: Token | None, message: str, hint: str, severity: Severity = Severity.ERROR) -> Finding:
    if token is None:
        return Finding(code=code, severity=severity, message=message, hint=hint)
    return Finding(code=code, severity=severity, message=message, hint=hint, file=token.file, line=token.line,
                   col=token.col, source_line=token.source_line)


def _retext(token: Token, text: str, shift: int = 0) -> Token:
    return Token(text, token.file, token.line, token.col + shift, token.source_line, token.env)


def _int(token: Token, findings: list[Finding]) -> int | None:
    try:
        return int(token.text)
    except ValueError:
        findings.append(_finding("PWR459", token, f"expected a whole number, found {token.text!r}",
                                 "write the value as digits"))
        return None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _json_object(token: Token, findings: list[Finding]) -> dict[str, Any] | None:
    try:
        value = parse_json(token.text)
    except DocumentError as err:
        findings.append(_finding("PWR457", token, f"--speculative-config cannot be read: {err.message}",
                                 "quote the whole object for the shell: --speculative-config '{\"method\": ...}'"))
        return None
    if not isinstance(value, dict):
        findings.append(_finding("PWR457", token, "--speculative-config is not a JSON object",
                                 "pass an object: '{\"method\": ..., \"num_speculative_tokens\": N}'"))
        return None
    return value


def manifest_document(spec: LaunchSpec, out_dir: Path, sha256_of: Callable[[Path], str]) -> dict[str, Any]:
    """The manifest for the launch's model and drafter; paths relative to `out_dir`, where it will be written."""
    if spec.model is None:
        raise ValueError("a launch line that names no model has no manifest (import_launch reports it as PWR458)")
    target = Path(spec.model.text).absolute()
    target_sha = sha256_of(target)
    drafters: list[dict[str, Any]] = []
    if spec.mode != modes.NONE and modes.mode(spec.mode).artifact == "target" and spec.draft_model is None:
        drafters.append({"kind": spec.mode})
    elif spec.draft_model is not None and _runs_a_file(spec.mode):
        path = Path(spec.draft_model.text).absolute()
        drafters.append({"kind": spec.mode, "path": os.path.relpath(path, out_dir), "size": path.stat().st_size,
                         "sha256": sha256_of(path), "target_sha256": target_sha})
    drafters += [{"kind": kind} for kind in spec.chain if kind in modes.WEIGHT_FREE and kind != spec.mode]
    return {
        "schema": "power.manifest/v1",
        "name": target.stem,
        "description": f"imported from a {spec.engine} launch line",
        "target": {"path": os.path.relpath(target, out_dir), "size": target.stat().st_size, "sha256": target_sha},
        "drafters": drafters,
    }


def profile_document(spec: LaunchSpec) -> dict[str, Any]:
    """The profile the launch line amounts to. llama.cpp keeps one rollback point per drafted token, so S = K."""
    k = spec.k or LLAMA_DEFAULT_N_MAX
    runtime = {key: value for key, value in (("ctx", spec.ctx), ("flash_attn", spec.flash_attn),
                                             ("kv_cache_type", spec.kv_cache_type)) if value is not None}
    sampling = {key: value for key, value in (("temperature", spec.temperature), ("seed", spec.seed))
                if value is not None}
    return {
        "schema": "power.profile/v1",
        "name": f"imported-{spec.engine}-{spec.mode}",
        "description": f"imported from a {spec.engine} launch line",
        "spec_mode": spec.mode,
        "spec_draft_max": k,
        "spec_mtp_recurrent_snapshots": k,
        "runtime": runtime,
        "sampling": sampling,
    }
