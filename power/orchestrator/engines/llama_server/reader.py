"""llama-server's launch line read the way llama-server reads it: into a LaunchSpec, each mistake a finding.

Every word goes through the pinned llama.cpp's option table (`flags`): its
spellings, which options take a value, which variable sets which option, and what
the server does with a word it does not know or an option it removed (it stops at
start, and the finding quotes the error it prints). Each option's disposition is
its row (`options`); a carried option's value reads through its settings entry
(`settings`); the defaults llama-server runs where the line leaves a setting are
the ones its help states.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from power import modes
from power.findings import Finding, Severity
from power.orchestrator.engines.llama_server import flags, options
from power.orchestrator.engines.llama_server.settings import NAME, field_of_option, settings_table
from power.orchestrator.inputs.launch_lines.options import NO_EFFECT, REFUSED, Row, refusal
from power.orchestrator.inputs.launch_lines.spec import LaunchSpec, finding, is_number, runs_a_file, sidecar
from power.orchestrator.inputs.launch_lines.tokens import Token

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


@dataclass(frozen=True)
class _Given:
    """One option as llama-server reads it: the option, the word (or variable) that named it, its value word."""

    option: flags.Option
    flag: Token
    value: Token | None

    @property
    def on(self) -> bool:
        """A switch's setting: its spelling (`--no-kv-unified` is off), or its variable's value."""
        if self.flag.env is not None:
            return (self.value.text if self.value else "").strip().lower() in {"1", "true", "on", "enabled", "yes"}
        return not flags.negative(self.flag.text)


def _llama_options(tokens: list[Token], findings: list[Finding]) -> Iterator[_Given]:
    """The options a llama-server launch sets, each known mistake a finding (as llama-server would stop at it)."""
    table = flags.table()
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token.env is not None:  # LLAMA_ARG_NAME=value: a flag token and its value token
            value = tokens[index + 1] if index + 1 < len(tokens) and tokens[index + 1].env == token.env else None
            index += 2 if value is not None else 1
            option = table.by_env.get(token.env)
            if option is None:
                findings.append(finding(
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
            findings.append(finding(
                "PWR441", token, f"{token.text} takes a value ({option.value}) but the line ends: "
                "llama-server stops at start with "
                f"`{flags.ARGUMENT_ERROR.format(flag=token.text, reason=flags.MISSING_VALUE)}`",
                f"write {token.text} {option.value}, or drop it"))
        elif option.removed:
            findings.append(_removed(option, token))
        elif values and _is_option(table, values[0].text):
            index -= len(values)  # read the option that follows as itself: one mistake, one finding
            findings.append(finding(
                "PWR441", token, f"{token.text} takes a value ({option.value}), but the next word is the option "
                f"{values[0].text}: llama-server reads {values[0].text} as {token.text}'s value",
                f"write {token.text} with its value ({token.text} {_first_choice(option)}) before {values[0].text}"))
        else:
            yield _Given(option, token, values[0] if values else None)


def _is_option(table: flags.Table, word: str) -> bool:
    """Whether a word in a value's place is itself an option (a negative number is a value)."""
    return word.startswith("-") and not is_number(word) and table.lookup(word) is not None


def _first_choice(option: flags.Option) -> str:
    """An example value: the first of a `[on|off|auto]` choice, else the placeholder."""
    value = (option.value or "").strip("[]{}")
    return value.split("|")[0].split(",")[0] if ("|" in value or "," in value) else (option.value or "VALUE")


def _invalid_argument(token: Token) -> Finding:
    word = flags.normalised(token.text)
    if token.text.startswith("--") and "=" in token.text:
        hint = f"llama-server reads `{token.text.split('=', 1)[0]} VALUE`, not `--option=VALUE`: split it in two"
    elif not token.text.startswith("-"):
        hint = "a stray word: every value belongs to the option before it; quote values that hold spaces"
    else:
        hint = FORMER_OPTIONS.get(word, "check the spelling against `llama-server --help` for this llama.cpp")
    return finding("PWR440", token, f"llama-server does not know {token.text!r}: it stops at start with "
                    f"`{flags.INVALID_ARGUMENT.format(flag=word)}`", hint)


def _removed(option: flags.Option, token: Token) -> Finding:
    """PWR454 with the error llama-server prints for a removed option, as a flag or as its variable."""
    error = _stop_error(token, str(option.removed))
    where = f"{token.env} (the variable of the removed {option.name})" if token.env else token.text
    replacement = str(option.removed).split(". use ", 1)[-1] if ". use " in str(option.removed) else None
    return finding("PWR454", token, f"{where} was removed: llama-server stops at start with `{error}`",
                    f"use {replacement}" if replacement else "drop it")


def _stop_error(flag: Token, reason: str) -> str:
    """The error llama-server prints when the option (or its variable) carries a value it refuses."""
    if flag.env is not None:
        return flags.ENV_ERROR.format(env=flag.env, reason=reason)
    return flags.ARGUMENT_ERROR.format(flag=flags.normalised(flag.text), reason=reason)


def read(tokens: list[Token]) -> tuple[LaunchSpec, list[Finding]]:
    """A llama-server launch line (program dropped) read option by option, as llama-server reads it."""
    spec = LaunchSpec(NAME)
    findings: list[Finding] = []
    spec_type: tuple[Token, Token] | None = None
    for given in list(_llama_options(tokens, findings)):
        row = options.row(given.option.name)
        if row.disposition == REFUSED:
            findings += _refused(row, given)
            continue
        field = field_of_option(given.option)  # the engine's settings table, read from flag (or env) to field
        if row.disposition == NO_EFFECT or field is None:
            continue
        spec.given[field] = given.flag
        if field == "kv_unified":
            spec.kv_unified = given.on
        elif given.value is None:
            continue
        elif field == "spec_type":
            spec_type = (given.flag, given.value)
        elif (read := settings_table().reader(field)) is not None:
            setattr(spec, field, read(given.value, findings))
    findings += _one_cache_type(spec.kv_cache_type, spec.kv_cache_type_v, "-ctk")
    findings += _one_cache_type(spec.draft_kv_cache_type, spec.draft_kv_cache_type_v, "--spec-draft-type-k")
    if spec_type is None:
        if spec.draft_model is not None:
            findings.append(finding(
                "PWR451", spec.draft_model,
                f"a draft model ({spec.draft_model.text}) is given without --spec-type",
                "say what the drafter is: --spec-type draft-mtp | draft-dflash | draft-dspark | draft-simple "
                "(Power fails closed rather than guessing the drafter's contract)"))
    else:
        findings += _read_spec_types(spec, *spec_type)
        if spec.draft_model is not None and not (runs_a_file(spec.mode) or sidecar(spec.mode)) and not findings:
            findings.append(finding(
                "PWR451", spec.draft_model,
                f"a draft model ({spec.draft_model.text}) is given, but --spec-type {spec_type[1].text} names no "
                "drafter that runs one: it is never used",
                "add the drafter's type to the list (e.g. --spec-type draft-dflash,ngram-mod), or drop -md"))
    _llama_defaults(spec)
    return spec, findings


def _refused(row: Row, given: _Given) -> list[Finding]:
    """The finding for an option Power cannot carry, unless it is given llama.cpp's own default."""
    value = ("on" if given.on else "off") if not given.option.takes_value else (given.value.text if given.value else "")
    said = f"{given.flag.env} ({given.option.name})" if given.flag.env else given.flag.text
    return refusal(row, given.flag, said, value, given.option.takes_value)


def _one_cache_type(k_type: str | None, v_type: Token | None, k_flag: str) -> list[Finding]:
    """PWR445: a V cache type other than the K type (llama.cpp's default for both is f16)."""
    default = flags.table().option(k_flag).default or "f16"
    if v_type is None or v_type.text == (k_type or default):
        return []
    return [finding("PWR445", v_type, f"the V cache type {v_type.text} differs from the K cache type "
                     f"{k_type or default}{'' if k_type else ' (llama.cpp default)'}: Power keeps one type for K and V",
                     f"give both the same type: {k_flag} {v_type.text} beside it, or drop it")]


def _llama_defaults(spec: LaunchSpec) -> None:
    """What llama-server runs where the line leaves a setting to it (the defaults its help states)."""
    table = flags.table()

    def default(option: str) -> int | None:
        return table.option(option).default_int

    if spec.slots is None or spec.slots < 1:
        spec.slots = LLAMA_AUTO_SLOTS
        spec.kv_unified = True if spec.kv_unified is None else spec.kv_unified
    spec.kv_unified = bool(spec.kv_unified)
    # no -fa: llama-server's default, auto (common/common.h, common_params.flash_attn_type)
    spec.flash_attn = "auto" if spec.flash_attn is None else spec.flash_attn
    spec.batch = spec.batch or default("--batch-size")
    spec.unstated_k = default("--spec-draft-n-max") or 1
    if spec.mode != modes.NONE and spec.k is None:
        spec.k = spec.unstated_k
    spec.ubatch = spec.ubatch or default("--ubatch-size")
    if any(kind in modes.WEIGHT_FREE for kind in spec.chain):
        spec.ngram_match = spec.ngram_match or default("--spec-ngram-mod-n-match")
        spec.ngram_draft_min = (
            spec.ngram_draft_min if spec.ngram_draft_min is not None else default("--spec-ngram-mod-n-min")
        )
        spec.ngram_draft_max = spec.ngram_draft_max or default("--spec-ngram-mod-n-max")
        if spec.mode in modes.WEIGHT_FREE:  # n-gram alone: its longest draft is the proposal width
            spec.k = spec.ngram_draft_max
            if "ngram_draft_max" in spec.given:
                spec.given["k"] = spec.given["ngram_draft_max"]
    if spec.mode in modes.CONFIDENCE_GATED and spec.p_min is None:
        spec.p_min = table.option("--spec-draft-p-min").default_float
    spec.draft_kv_cache_type = _own_draft_cache_type(spec, table.option("--spec-draft-type-k").default or "f16")


def _own_draft_cache_type(spec: LaunchSpec, default: str) -> str | None:
    """The drafter's cache type where it drafts in a context of its own and the type differs from the target's
    (llama.cpp's draft default, f16, whatever the target's); None: the target's."""
    draft_type = spec.draft_kv_cache_type or default
    own_context = spec.mode != modes.NONE and spec.mode not in modes.WEIGHT_FREE
    return draft_type if own_context and draft_type != (spec.kv_cache_type or default) else None


def _read_spec_types(spec: LaunchSpec, flag: Token, value: Token) -> list[Finding]:
    findings: list[Finding] = []
    drafters: list[str] = []
    names = [name.strip() for name in value.text.split(",") if name.strip()]
    for name in names:
        if name in modes.LLAMA_RETIRED:
            code = "PWR450" if name == modes.MTP else "PWR455"
            findings.append(finding(
                code, value, f"--spec-type {name} is the pre-rename spelling: this llama.cpp stops at start with "
                f"`{_stop_error(flag, f'unknown speculative type: {name}')}` (builds between the rename and this "
                "check served without speculation, silently)",
                f"use --spec-type {modes.LLAMA_RETIRED[name]} (renamed in May 2026, llama.cpp b9180+)"))
        elif name in CONTEXT_BACKED:
            drafters.append(name)
        elif name == modes.LLAMA_NO_SPECULATION and len(names) > 1:
            findings.append(finding(
                "PWR455", value, f"`none` in --spec-type {value.text} turns speculation off: llama.cpp drops every "
                "other type in the list, silently", "drop `none` from the list, or give `none` alone"))
            spec.chain.clear()
            return findings
        elif name in DRAFTLESS:
            if name != modes.LLAMA_NO_SPECULATION:
                spec.chain.append(modes.BY_LLAMA_SPEC_TYPE[name])
        else:
            findings.append(finding(
                "PWR455", value, f"unknown speculative type {name!r}: llama-server stops at start with "
                f"`{_stop_error(flag, f'unknown speculative type: {name}')}`",
                "known: " + ", ".join(sorted(DRAFTLESS | set(CONTEXT_BACKED)))))
    if len(drafters) > 1:
        findings.append(finding(
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
            findings.append(finding("PWR455", value, why or f"Power has no adapter for {drafters[0]}",
                                     "plan it as draft-mtp, draft-dflash or draft-dspark, or keep it outside Power"))
        else:
            spec.mode = mode
            spec.chain.append(mode)
    elif spec.chain:
        spec.mode = spec.chain[0]
    return findings
