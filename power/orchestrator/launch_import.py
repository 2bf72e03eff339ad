"""`power import`: an existing llama-server or vLLM launch turned into a Power manifest + profile, with findings.

llama-server's command line is read through the table of the pinned llama.cpp's
options (`power.orchestrator.llama_flags`, generated from the real binary), so
every word is read the way llama-server reads it: its spellings, which options
take a value, which variable sets which option, and what the server does with a
word it does not know. vLLM's speculative methods are `power.modes`' (from
`vllm/config/speculative.py`). The findings are the launch-line mistakes that
cost speculation silently or kill the server at start:

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
- PWR444/PWR446/PWR447 an option Power does not carry (`llama_options` and `vllm_options` say, for each option, whether
  it is carried, refused with its fix, or of no effect on the plan); PWR445 a V cache type other than the K type

A finding about a written document (which is never written when it has an error) is told at the launch line
(`on_the_line`): at the option that set the key, or with the flag to add where the line left it to the default.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Callable, Iterator

from power import codes, modes
from power.artifacts import contracts
from power.artifacts.documents import DocumentError, is_regular_file, parse_json
from power.artifacts.facts import ArtifactError, inspect_artifact
from power.findings import Finding, Severity
from power.orchestrator import llama_flags, llama_options, vllm_options
from power.orchestrator.engines import adapter
from power.orchestrator.engines.llama_server import field_of_option
from power.orchestrator.engines.vllm import SETTINGS as VLLM_SETTINGS
from power.orchestrator.launch_tokens import EnvNames, Token
from power.orchestrator.rules import override_target
from power.orchestrator.units import format_size

LLAMA_SERVER = "llama-server"
VLLM = "vllm"


def env_names(engine: str) -> EnvNames | None:
    """The variables an engine reads as options (`LLAMA_ARG_CTX_SIZE` is `--ctx-size`); vLLM has no such convention."""
    return adapter(engine).env_names()


# `-np` left at its default (-1, "auto") makes llama-server serve 4 slots over one unified KV cache
# (tools/server/server.cpp: "n_parallel is set to auto, using n_parallel = 4 and kv_unified = true").
LLAMA_AUTO_SLOTS = 4
# Options llama.cpp dropped without keeping a removal message: they are unknown words now.
FORMER_OPTIONS = {
    "-cd": "drop it: the draft context is built at the target's context size; budget drafter KV with `power size`",
    "--ctx-size-draft": "drop it: the draft context is built at the target's context size; budget drafter KV with "
                        "`power size`",
}
# llama.cpp `--spec-type` values of context-backed drafters -> Power's mode (None: no Power adapter).
CONTEXT_BACKED: dict[str, str | None] = {
    spelling: kind for spelling, kind in modes.BY_LLAMA_SPEC_TYPE.items() if kind in modes.CONTEXT_BACKED
} | dict.fromkeys(modes.FOREIGN_LLAMA_SPEC_TYPES)
# `--spec-type` values that need no drafter: no speculation, or a weight-free n-gram kind.
DRAFTLESS = {modes.LLAMA_NO_SPECULATION} | {
    spelling for spelling, kind in modes.BY_LLAMA_SPEC_TYPE.items() if kind in modes.WEIGHT_FREE}

VLLM_REMOVED = {
    "--speculative-model": None, "--num-speculative-tokens": None, "--speculative-draft-tensor-parallel-size": None,
    "--speculative-max-model-len": None, "--speculative-disable-by-batch-size": None,
    "--ngram-prompt-lookup-max": None, "--ngram-prompt-lookup-min": None, "--speculative-disable-mqa-scorer": None,
    "--spec-decoding-acceptance-method": None,
    "--swap-space": "drop it: CPU swap space is retired; vLLM's CPU KV offloading is --kv-offloading-size with "
                    "--kv-offloading-backend",
}
VLLM_SWITCHES = {"--trust-remote-code", "--enforce-eager", "--enable-prefix-caching"}

# A drafter without a window at this context or more caches enough KV to matter (DSpark: 5 GiB at 262144).
LARGE_CONTEXT = 32768


@dataclass
class LaunchSpec:
    """What the launch line asks for, in Power's terms (None: the engine's default, filled in by `profile_document`)."""

    engine: str
    model: Token | None = None
    draft_model: Token | None = None
    mode: str = modes.NONE
    chain: list[str] = field(default_factory=list)
    k: int | None = None
    ctx: int | None = None
    kv_cache_type: str | None = None
    draft_kv_cache_type: str | None = None
    flash_attn: bool | str | None = None  # "auto": llama.cpp's default
    seed: int | None = None
    temperature: float | None = None
    slots: int | None = None
    kv_unified: bool | None = None
    batch: int | None = None
    ubatch: int | None = None
    p_min: float | None = None
    ngram_match: int | None = None
    ngram_draft_min: int | None = None
    ngram_draft_max: int | None = None
    tensor_parallel: int | None = None
    cuda_graphs: bool | None = None
    gpu_layers: int | str | None = None  # a count, or "all"
    split_mode: str | None = None
    tensor_split: list[float] | None = None
    main_gpu: int | None = None
    draft_device: int | None = None  # a position in the deployment's devices
    draft_gpu_layers: int | str | None = None
    draft_override_tensor: list[str] | None = None
    kv_cache_type_v: Token | None = None
    draft_kv_cache_type_v: Token | None = None
    # the option word that set each field, so a finding about what it became points back at the line
    given: dict[str, Token] = field(default_factory=dict)
    start: Token | None = None  # the line's first word after the program


@dataclass
class ImportResult:
    spec: LaunchSpec
    findings: list[Finding]


def import_launch(engine: str, tokens: list[Token]) -> ImportResult:
    """Read a launch line (tokens already located) into a LaunchSpec and its findings."""
    tokens = _without_program(engine, tokens)
    findings = [_unresolved(token) for token in tokens if token.unresolved]
    tokens = [token for token in tokens if token.text or not token.unresolved]  # an undefined `$VAR` word is no word
    spec, read = _READERS[engine](tokens)
    spec.start = tokens[0] if tokens else None
    findings += read
    if spec.model is None:
        findings.append(_finding("PWR458", tokens[0] if tokens else None,
                                 "the launch line names no local model file",
                                 "pass the target GGUF with -m PATH (an -hf repository cannot be checked offline)"))
    findings += _window_findings(spec)
    findings.sort(key=lambda f: (f.file or "", f.line or 0, f.col or 0))
    return ImportResult(spec, findings)


def _without_program(engine: str, tokens: list[Token]) -> list[Token]:
    """Drop the program name (`llama-server`, `vllm serve`, `python -m vllm.entrypoints...`) when present."""
    environment = [token for token in tokens if token.env is not None]
    rest = [token for token in tokens if token.env is None]
    while rest and not rest[0].text.startswith("-") and adapter(engine).program_word(rest[0].text):
        rest.pop(0)
    return environment + rest


def _unresolved(token: Token) -> Finding:
    return _finding("PWR442", token, f"${token.unresolved} is not defined by the unit (no Environment= or "
                    f"EnvironmentFile= sets it): systemd expands it to nothing, so the engine never sees this word",
                    f"define {token.unresolved} in the unit, or write the value itself", Severity.WARNING)


@dataclass(frozen=True)
class _Given:
    """One option as llama-server reads it: the option, the word (or variable) that named it, its value word."""

    option: llama_flags.Option
    flag: Token
    value: Token | None

    @property
    def on(self) -> bool:
        """A switch's setting: its spelling (`--no-kv-unified` is off), or its variable's value."""
        if self.flag.env is not None:
            return (self.value.text if self.value else "").strip().lower() in {"1", "true", "on", "enabled", "yes"}
        return not llama_flags.negative(self.flag.text)


def _llama_options(tokens: list[Token], findings: list[Finding]) -> Iterator[_Given]:
    """The options a llama-server launch sets, each known mistake a finding (as llama-server would stop at it)."""
    table = llama_flags.table()
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token.env is not None:  # LLAMA_ARG_NAME=value: a flag token and its value token
            value = tokens[index + 1] if index + 1 < len(tokens) and tokens[index + 1].env == token.env else None
            index += 2 if value is not None else 1
            option = table.by_env.get(token.env)
            if option is None:
                findings.append(_finding(
                    "PWR443", token, f"llama-server reads no variable {token.env}: it is ignored, silently",
                    "use the variable llama-server names for the option (`llama-server --help` lists them as env:)",
                    Severity.WARNING))
            elif option.removed:
                findings.append(_removed(option, token))
            else:
                yield _Given(option, token, value)
            continue
        option = table.lookup(token.text)
        if option is None:
            findings.append(_invalid_argument(token))
            index += 1
            continue
        values = tokens[index + 1 : index + 1 + option.values]
        index += 1 + len(values)
        if len(values) < option.values:
            findings.append(_finding(
                "PWR441", token, f"{token.text} takes a value ({option.value}) but the line ends: llama-server stops at "
                f"start with `{llama_flags.ARGUMENT_ERROR.format(flag=token.text, reason=llama_flags.MISSING_VALUE)}`",
                f"write {token.text} {option.value}, or drop it"))
        elif option.removed:
            findings.append(_removed(option, token))
        elif values and _is_option(table, values[0].text):
            index -= len(values)  # read the option that follows as itself: one mistake, one finding
            findings.append(_finding(
                "PWR441", token, f"{token.text} takes a value ({option.value}), but the next word is the option "
                f"{values[0].text}: llama-server reads {values[0].text} as {token.text}'s value",
                f"write {token.text} with its value ({token.text} {_first_choice(option)}) before {values[0].text}"))
        else:
            yield _Given(option, token, values[0] if values else None)


def _is_option(table: llama_flags.Table, word: str) -> bool:
    """Whether a word in a value's place is itself an option (a negative number is a value)."""
    return word.startswith("-") and not _is_number(word) and table.lookup(word) is not None


def _first_choice(option: llama_flags.Option) -> str:
    """An example value: the first of a `[on|off|auto]` choice, else the placeholder."""
    value = (option.value or "").strip("[]{}")
    return value.split("|")[0].split(",")[0] if ("|" in value or "," in value) else (option.value or "VALUE")


def _invalid_argument(token: Token) -> Finding:
    word = llama_flags.normalised(token.text)
    if token.text.startswith("--") and "=" in token.text:
        hint = f"llama-server reads `{token.text.split('=', 1)[0]} VALUE`, not `--option=VALUE`: split it in two"
    elif not token.text.startswith("-"):
        hint = "a stray word: every value belongs to the option before it; quote values that hold spaces"
    else:
        hint = FORMER_OPTIONS.get(word, "check the spelling against `llama-server --help` for this llama.cpp")
    return _finding("PWR440", token, f"llama-server does not know {token.text!r}: it stops at start with "
                    f"`{llama_flags.INVALID_ARGUMENT.format(flag=word)}`", hint)


def _removed(option: llama_flags.Option, token: Token) -> Finding:
    """PWR454 with the error llama-server prints for a removed option, as a flag or as its variable."""
    error = _stop_error(token, str(option.removed))
    where = f"{token.env} (the variable of the removed {option.name})" if token.env else token.text
    replacement = str(option.removed).split(". use ", 1)[-1] if ". use " in str(option.removed) else None
    return _finding("PWR454", token, f"{where} was removed: llama-server stops at start with `{error}`",
                    f"use {replacement}" if replacement else "drop it")


def _stop_error(flag: Token, reason: str) -> str:
    """The error llama-server prints when the option (or its variable) carries a value it refuses."""
    if flag.env is not None:
        return llama_flags.ENV_ERROR.format(env=flag.env, reason=reason)
    return llama_flags.ARGUMENT_ERROR.format(flag=llama_flags.normalised(flag.text), reason=reason)


def _read_llama_server(tokens: list[Token]) -> tuple[LaunchSpec, list[Finding]]:
    spec = LaunchSpec(LLAMA_SERVER)
    findings: list[Finding] = []
    spec_type: tuple[Token, Token] | None = None
    for given in list(_llama_options(tokens, findings)):
        row = llama_options.row(given.option.name)
        if row.disposition == llama_options.REFUSED:
            findings += _refused(row, given)
            continue
        field = field_of_option(given.option)  # the engine's settings table, read from flag (or env) to field
        if row.disposition == llama_options.NO_EFFECT or field is None:
            continue
        spec.given[field] = given.flag
        if field == "kv_unified":
            spec.kv_unified = given.on
        elif given.value is None:
            continue
        elif field == "spec_type":
            spec_type = (given.flag, given.value)
        elif field in _READ_AS:
            setattr(spec, field, _READ_AS[field](given.value, findings))
    findings += _one_cache_type(spec.kv_cache_type, spec.kv_cache_type_v, "-ctk")
    findings += _one_cache_type(spec.draft_kv_cache_type, spec.draft_kv_cache_type_v, "--spec-draft-type-k")
    if spec_type is None:
        if spec.draft_model is not None:
            findings.append(_finding(
                "PWR451", spec.draft_model,
                f"a draft model ({spec.draft_model.text}) is given without --spec-type",
                "say what the drafter is: --spec-type draft-mtp | draft-dflash | draft-dspark | draft-simple "
                "(Power fails closed rather than guessing the drafter's contract)"))
    else:
        findings += _read_spec_types(spec, *spec_type)
        if spec.draft_model is not None and not (_runs_a_file(spec.mode) or _sidecar(spec.mode)) and not findings:
            findings.append(_finding(
                "PWR451", spec.draft_model,
                f"a draft model ({spec.draft_model.text}) is given, but --spec-type {spec_type[1].text} names no "
                "drafter that runs one: it is never used",
                "add the drafter's type to the list (e.g. --spec-type draft-dflash,ngram-mod), or drop -md"))
    _llama_defaults(spec)
    return spec, findings


def _refused(row: llama_options.Row, given: _Given) -> list[Finding]:
    """The finding for an option Power cannot carry, unless it is given llama.cpp's own default."""
    value = ("on" if given.on else "off") if not given.option.takes_value else (given.value.text if given.value else "")
    said = f"{given.flag.env} ({given.option.name})" if given.flag.env else given.flag.text
    return _refusal(row, given.flag, said, value, given.option.takes_value)


def _refused_word(row: llama_options.Row, flag: Token, value: Token | None) -> list[Finding]:
    """The same for a vLLM argument (a switch reads `on`)."""
    return _refusal(row, flag, flag.text, value.text if value else "on", value is not None)


def _refusal(row: llama_options.Row, flag: Token, said: str, value: str, show_value: bool) -> list[Finding]:
    if row.accepted(value):
        return []
    return [_finding(row.code, flag, f"{said}{' ' + value if show_value else ''}: {row.meaning}", str(row.fix),
                     Severity(codes.CODES[row.code][0]))]


def _vllm_kv_dtype(token: Token, findings: list[Finding]) -> str | None:
    """vLLM's --kv-cache-dtype: `auto` is the model's own type (Power's default); its fp8 types have no counterpart."""
    if token.text == "auto":
        return None
    findings.append(_finding("PWR444", token, f"--kv-cache-dtype {token.text}: Power sizes and renders vLLM's KV in "
                             "the model's own type (auto); it has no counterpart for this one", "drop it, or write "
                             "--kv-cache-dtype auto"))
    return None


def _one_cache_type(k_type: str | None, v_type: Token | None, k_flag: str) -> list[Finding]:
    """PWR445: a V cache type other than the K type (llama.cpp's default for both is f16)."""
    default = llama_flags.table().option(k_flag).default or "f16"
    if v_type is None or v_type.text == (k_type or default):
        return []
    return [_finding("PWR445", v_type, f"the V cache type {v_type.text} differs from the K cache type "
                     f"{k_type or default}{'' if k_type else ' (llama.cpp default)'}: Power keeps one type for K and V",
                     f"give both the same type: {k_flag} {v_type.text} beside it, or drop it")]


def _token(token: Token, findings: list[Finding]) -> Token:  # noqa: ARG001 - the readers share one signature
    return token


def _text(token: Token, findings: list[Finding]) -> str:  # noqa: ARG001
    return token.text


def _flash_attn(token: Token, findings: list[Finding]) -> bool | str | None:
    """-fa on|off|auto as llama.cpp's common/arg.cpp reads it: `auto`, its default, stays auto (see
    power.documents.plan.flash_attention_on), never off."""
    word = token.text.lower()
    if word in {"on", "enabled", "true", "1"}:
        return True
    if word in {"off", "disabled", "false", "0"}:
        return False
    if word in {"auto", "-1"}:
        return "auto"
    findings.append(_finding("PWR459", token, f"-fa takes on, off or auto, found {token.text!r}",
                             "write -fa on, -fa off or -fa auto"))
    return None


def _flash_attn_of(spec: LaunchSpec) -> bool | str | None:
    """The launch's -fa, or llama-server's default where it gives none: auto (common/common.h,
    common_params.flash_attn_type)."""
    return "auto" if spec.flash_attn is None and spec.engine == LLAMA_SERVER else spec.flash_attn


def _layers(token: Token, findings: list[Finding]) -> int | str | None:
    """-ngl / --spec-draft-ngl: a count, or `auto` / `all` / a negative number: every layer (with --fit off, which
    Power renders, llama.cpp's auto offloads every layer)."""
    if token.text in {"auto", "all"} or (_is_number(token.text) and token.text.startswith("-")):
        return "all"
    return _int(token, findings)


def _split_mode(token: Token, findings: list[Finding]) -> str | None:
    if token.text in {"layer", "none"}:
        return token.text
    findings.append(_finding("PWR444", token, f"-sm {token.text}: Power sizes a layer split (-sm layer) or one device "
                             "(-sm none) only; a row or tensor split shards each layer's matrices, which no plan sizes",
                             "use -sm layer with -ts, or -sm none with -mg"))
    return None


def _ratios(token: Token, findings: list[Finding]) -> list[float] | None:
    """-ts 3,1 (llama.cpp also reads 3/1)."""
    parts = token.text.replace("/", ",").split(",")
    if all(_is_number(part) for part in parts):
        return [float(part) for part in parts]
    findings.append(_finding("PWR459", token, f"expected ratios such as 3,1, found {token.text!r}",
                             "write one number per device, separated by commas"))
    return None


def _device(token: Token, findings: list[Finding]) -> int | None:
    """--spec-draft-device CUDA1: the position of the drafter's device (the render lists the plan's GPUs as CUDA0,
    CUDA1, ... in order)."""
    name = token.text.strip()
    digits = name.lstrip("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
    if name != digits and digits.isdigit():
        return int(digits)
    findings.append(_finding("PWR444", token, f"--spec-draft-device {name}: Power places a drafter on one GPU of the "
                             "deployment, named as llama-server names it (CUDA0, CUDA1, ...)",
                             "name one device, e.g. --spec-draft-device CUDA1; for a drafter on the CPU write "
                             "--spec-draft-ngl 0"))
    return None


def _overrides(token: Token, findings: list[Finding]) -> list[str] | None:
    """--spec-draft-override-tensor PATTERN=BUFFER,...: each entry kept as llama.cpp writes it (split on commas, as
    llama.cpp splits it), each a host (CPU) or a GPU (CUDA<n>) buffer."""
    entries = [entry for entry in token.text.split(",") if entry]
    bad = [entry for entry in entries if override_target(entry) is None]
    if bad:
        findings.append(_finding("PWR444", token, f"--spec-draft-override-tensor {bad[0]}: Power sizes a drafter "
                                 "tensor placed in host memory (CPU) or on one of the deployment's GPUs (CUDA<n>), by "
                                 "a pattern that compiles", "write PATTERN=CPU or PATTERN=CUDA1, e.g. "
                                 "'blk\\.1\\.ffn_.*=CPU'"))
        return None
    return entries


# How each setting's value reads, by its field (the llama-server adapter's settings table names the field); the
# LaunchSpec attribute of the same name holds it.
_READ_AS: dict[str, Callable[[Token, list[Finding]], Any]] = {
    "model": _token, "draft_model": _token, "k": lambda t, f: _int(t, f), "ctx": lambda t, f: _int(t, f),
    "kv_cache_type": _text, "draft_kv_cache_type": _text, "flash_attn": _flash_attn, "seed": lambda t, f: _int(t, f),
    "temperature": lambda t, f: _float(t, f), "slots": lambda t, f: _int(t, f), "batch": lambda t, f: _int(t, f),
    "ubatch": lambda t, f: _int(t, f), "p_min": lambda t, f: _float(t, f),
    "ngram_match": lambda t, f: _int(t, f), "ngram_draft_min": lambda t, f: _int(t, f),
    "ngram_draft_max": lambda t, f: _int(t, f), "kv_cache_type_v": _token, "draft_kv_cache_type_v": _token,
    "gpu_layers": _layers, "draft_gpu_layers": _layers, "split_mode": _split_mode, "tensor_split": _ratios,
    "main_gpu": lambda t, f: _int(t, f), "draft_device": _device, "tensor_parallel": lambda t, f: _int(t, f),
    "draft_override_tensor": lambda t, f: _overrides(t, f),
}


def _llama_defaults(spec: LaunchSpec) -> None:
    """What llama-server runs where the line leaves a setting to it (the defaults its help states)."""
    table = llama_flags.table()

    def default(option: str) -> int | None:
        return table.option(option).default_int

    if spec.slots is None or spec.slots < 1:
        spec.slots = LLAMA_AUTO_SLOTS
        spec.kv_unified = True if spec.kv_unified is None else spec.kv_unified
    spec.kv_unified = bool(spec.kv_unified)
    spec.batch = spec.batch or default("--batch-size")
    spec.ubatch = spec.ubatch or default("--ubatch-size")
    if spec.mode != modes.NONE and spec.k is None:
        spec.k = default("--spec-draft-n-max")
    if any(kind in modes.WEIGHT_FREE for kind in spec.chain):
        spec.ngram_match = spec.ngram_match or default("--spec-ngram-mod-n-match")
        spec.ngram_draft_min = spec.ngram_draft_min if spec.ngram_draft_min is not None else default("--spec-ngram-mod-n-min")
        spec.ngram_draft_max = spec.ngram_draft_max or default("--spec-ngram-mod-n-max")
        if spec.mode in modes.WEIGHT_FREE:  # n-gram alone: its longest draft is the proposal width
            spec.k = spec.ngram_draft_max
            if "ngram_draft_max" in spec.given:
                spec.given["k"] = spec.given["ngram_draft_max"]
    if spec.mode in modes.CONFIDENCE_GATED and spec.p_min is None:
        spec.p_min = table.option("--spec-draft-p-min").default_float


def _read_spec_types(spec: LaunchSpec, flag: Token, value: Token) -> list[Finding]:
    findings: list[Finding] = []
    drafters: list[str] = []
    names = [name.strip() for name in value.text.split(",") if name.strip()]
    for name in names:
        if name in modes.LLAMA_RETIRED:
            code = "PWR450" if name == modes.MTP else "PWR455"
            findings.append(_finding(
                code, value, f"--spec-type {name} is the pre-rename spelling: this llama.cpp stops at start with "
                f"`{_stop_error(flag, f'unknown speculative type: {name}')}` (builds between the rename and this "
                "check served without speculation, silently)",
                f"use --spec-type {modes.LLAMA_RETIRED[name]} (renamed in May 2026, llama.cpp b9180+)"))
        elif name in CONTEXT_BACKED:
            drafters.append(name)
        elif name == modes.LLAMA_NO_SPECULATION and len(names) > 1:
            findings.append(_finding(
                "PWR455", value, f"`none` in --spec-type {value.text} turns speculation off: llama.cpp drops every "
                "other type in the list, silently", "drop `none` from the list, or give `none` alone"))
            spec.chain.clear()
            return findings
        elif name in DRAFTLESS:
            if name != modes.LLAMA_NO_SPECULATION:
                spec.chain.append(modes.BY_LLAMA_SPEC_TYPE[name])
        else:
            findings.append(_finding(
                "PWR455", value, f"unknown speculative type {name!r}: llama-server stops at start with "
                f"`{_stop_error(flag, f'unknown speculative type: {name}')}`",
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
            named = modes.FOREIGN_LLAMA_SPEC_TYPES.get(drafters[0])  # a mode Power runs on another engine only
            why = modes.mode(named).llama_refusal if named in modes.BY_NAME else None
            findings.append(_finding("PWR455", value, why or f"Power has no adapter for {drafters[0]}",
                                     "plan it as draft-mtp, draft-dflash or draft-dspark, or keep it outside Power"))
        else:
            spec.mode = mode
            spec.chain.append(mode)
    elif spec.chain:
        spec.mode = spec.chain[0]
    return findings


def _vllm_pairs(tokens: list[Token]) -> list[tuple[Token, Token | None]]:
    """(flag, value) pairs as vLLM's argparse reads them: `--flag=value` split; a flag before another flag has none."""
    pairs: list[tuple[Token, Token | None]] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token.text.startswith("--") and "=" in token.text:
            flag, value = token.text.split("=", 1)
            pairs.append((_retext(token, flag), _retext(token, value, shift=len(flag) + 1)))
            index += 1
            continue
        following = tokens[index + 1] if index + 1 < len(tokens) else None
        takes_value = token.text not in VLLM_SWITCHES and following is not None and (
            not following.text.startswith("-") or _is_number(following.text))
        pairs.append((token, following if takes_value else None))
        index += 2 if takes_value else 1
    return pairs


def _read_vllm(tokens: list[Token]) -> tuple[LaunchSpec, list[Finding]]:
    spec, findings = LaunchSpec(VLLM), []
    if tokens and not tokens[0].text.startswith("-"):
        spec.model = tokens[0]
        tokens = tokens[1:]
    config: tuple[Token, dict[str, Any]] | None = None
    for flag, value in _vllm_pairs(tokens):
        row = vllm_options.by_flag().get(flag.text)
        if flag.text in VLLM_REMOVED:
            hint = VLLM_REMOVED[flag.text] or ("pass the drafter through --speculative-config "
                                               "'{\"method\": ..., \"model\": ..., \"num_speculative_tokens\": N}'")
            findings.append(_finding("PWR456", flag, f"{flag.text} was removed from vLLM: it stops at start with "
                                     f"`unrecognized arguments: {flag.text}`", hint))
        elif row is None:
            findings.append(_finding(
                "PWR446", flag, f"Power does not read the vLLM argument {flag.text}: it is not carried into the plan",
                "drop it, or check it changes neither what is loaded nor what a request returns, and set it on the "
                "rendered command yourself", Severity.WARNING))
        elif row.disposition == llama_options.REFUSED:
            findings += _refused_word(row, flag, value)
        elif row.disposition == llama_options.NO_EFFECT:
            continue
        elif VLLM_SETTINGS.field_of_flag(flag.text) == "eager":
            spec.cuda_graphs, spec.given["cuda_graphs"] = False, flag
        elif value is None:
            continue
        elif (field := VLLM_SETTINGS.field_of_flag(flag.text)) == "kv_cache_type":
            spec.given["kv_cache_type"] = flag
            spec.kv_cache_type = _vllm_kv_dtype(value, findings)
        elif field in _READ_AS:  # the adapter's table, flag -> field
            spec.given[str(field)] = flag
            setattr(spec, str(field), _READ_AS[str(field)](value, findings))
        elif flag.text == "--speculative-config":
            spec.given.update(dict.fromkeys(("spec_type", "k", "draft_model"), flag))
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
    if spec.mode not in modes.WEIGHT_FREE:
        return findings
    # vLLM's prompt lookup tries match lengths from prompt_lookup_max down to prompt_lookup_min (default 1).
    longest, shortest = config.get("prompt_lookup_max"), config.get("prompt_lookup_min", 1)
    spec.ngram_match, spec.ngram_draft_min, spec.ngram_draft_max = longest, 1, spec.k
    if longest is not None and shortest != longest:
        findings.append(_finding(
            "PWR455", where, f"prompt lookup over match lengths {shortest}..{longest}: Power's n-gram matches one "
            f"length (llama.cpp's n-match); imported as ngram_match = {longest}",
            "set prompt_lookup_min = prompt_lookup_max to run the same lookup on both engines", Severity.WARNING))
    return findings


# How each engine's launch line is read into a LaunchSpec.
_READERS: dict[str, Callable[[list[Token]], tuple[LaunchSpec, list[Finding]]]] = {
    LLAMA_SERVER: _read_llama_server, VLLM: _read_vllm}


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
    return [_finding(
        "PWR453", spec.draft_model,
        f"the drafter {path.name} declares no sliding window, so its KV caches all {spec.ctx:,} positions of the "
        f"context ({format_size(per_position * spec.ctx)} at {format_size(per_position)} per position)",
        "budget that memory on the draft device (`power size`), shorten the context, or use a drafter that "
        "declares attention.sliding_window", severity=Severity.WARNING)]


def _window_by_contract(spec: LaunchSpec) -> list[Finding]:
    """Without the file, the DSpark contract still says it: DSpark headers carry no sliding-window key."""
    if spec.mode != modes.DSPARK or "attention.sliding_window" in contracts.REQUIRED_KEYS[modes.DSPARK]:
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


def _float(token: Token, findings: list[Finding]) -> float | None:
    if _is_number(token.text):
        return float(token.text)
    findings.append(_finding("PWR459", token, f"expected a number, found {token.text!r}", "write the value as digits"))
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
    """The manifest for the launch's model and drafters; paths relative to `out_dir`, where it will be written."""
    if spec.model is None:
        raise ValueError("a launch without a model has no manifest (PWR458 says so first)")
    target = Path(spec.model.text).absolute()
    target_sha = sha256_of(target)
    drafters: list[dict[str, Any]] = []
    if spec.draft_model is not None and (_runs_a_file(spec.mode) or _sidecar(spec.mode)):
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


def _sidecar(mode: str) -> bool:
    """Whether the mode's head may come as its own file (`--spec-draft-model MTP-only.gguf --spec-type draft-mtp`)."""
    return mode != modes.NONE and modes.mode(mode).sidecar


def profile_document(spec: LaunchSpec) -> dict[str, Any]:
    """The profile the launch line amounts to, every setting as the engine runs it (its defaults filled in).

    llama.cpp keeps one rollback point per drafted token, so S = K.
    """
    k = spec.k or llama_flags.table().option("--spec-draft-n-max").default_int or 1
    ngram = {}
    if any(kind in modes.WEIGHT_FREE for kind in spec.chain):
        ngram = {"ngram_match": spec.ngram_match, "ngram_draft_min": max(1, spec.ngram_draft_min or 1),
                 "ngram_draft_max": spec.ngram_draft_max if spec.ngram_draft_max != k else None}
    runtime = {key: value for key, value in (
        ("ctx", spec.ctx), ("slots", spec.slots), ("kv_unified", spec.kv_unified), ("batch", spec.batch),
        ("ubatch", spec.ubatch), ("flash_attn", _flash_attn_of(spec)), ("kv_cache_type", spec.kv_cache_type),
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
    """Offload and split, and where the drafter runs and in which cache type (llama.cpp's draft default: f16)."""
    placement = {key: value for key, value in (
        ("gpu_layers", spec.gpu_layers), ("split_mode", spec.split_mode), ("tensor_split", spec.tensor_split),
        ("main_gpu", spec.main_gpu), ("draft_device", spec.draft_device), ("draft_gpu_layers", spec.draft_gpu_layers),
        ("tensor_parallel", spec.tensor_parallel), ("cuda_graphs", spec.cuda_graphs),
        ("draft_override_tensor", spec.draft_override_tensor),
    ) if value is not None}
    default = llama_flags.table().option("--spec-draft-type-k").default or "f16"
    draft_type = spec.draft_kv_cache_type or default
    if _drafts_in_a_context(spec.mode) and draft_type != (spec.kv_cache_type or default):
        placement["draft_kv_cache_type"] = draft_type
    return placement


def _drafts_in_a_context(mode: str) -> bool:
    """Whether the mode drafts in a draft context of its own (a drafter file or an MTP head), with its own KV."""
    return mode != modes.NONE and mode not in modes.WEIGHT_FREE


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
