"""vLLM's launch line read as vLLM's argparse reads it: into a LaunchSpec, each mistake a finding.

`--flag=value` splits in two, a flag before another flag has no value; each
argument's disposition is its row (`options`), a carried argument's value reads
through its settings entry (`settings`), and the speculative method is read from
`--speculative-config` (or the `--spec-*` shorthands) into `power.modes`' kinds
(vLLM's names from `vllm/config/speculative.py`).
"""

from __future__ import annotations

from typing import Any

from power import modes
from power.artifacts.bounded_reader import DocumentError, parse_json
from power.findings import Finding, Severity
from power.orchestrator.engines.vllm import options
from power.orchestrator.engines.vllm.settings import NAME, SETTINGS
from power.orchestrator.inputs.launch_lines.options import NO_EFFECT, REFUSED, Row, refusal
from power.orchestrator.inputs.launch_lines.spec import LaunchSpec, finding, is_number, read_int, retext, runs_a_file
from power.orchestrator.inputs.launch_lines.tokens import Token

REMOVED = {
    "--speculative-model": None, "--num-speculative-tokens": None, "--speculative-draft-tensor-parallel-size": None,
    "--speculative-max-model-len": None, "--speculative-disable-by-batch-size": None,
    "--ngram-prompt-lookup-max": None, "--ngram-prompt-lookup-min": None, "--speculative-disable-mqa-scorer": None,
    "--spec-decoding-acceptance-method": None,
    "--swap-space": "drop it: CPU swap space is retired; vLLM's CPU KV offloading is --kv-offloading-size with "
                    "--kv-offloading-backend",
}
SWITCHES = {"--trust-remote-code", "--enforce-eager", "--enable-prefix-caching"}
# K where the line states none: vLLM has no default (a method needs num_speculative_tokens) and without a method the
# profile's K is unused; the profile takes llama.cpp's --spec-draft-n-max default
UNSTATED_K = 3


def _refused_word(row: Row, flag: Token, value: Token | None) -> list[Finding]:
    """The same for a vLLM argument (a switch reads `on`)."""
    return refusal(row, flag, flag.text, value.text if value else "on", value is not None)


def _pairs(tokens: list[Token]) -> list[tuple[Token, Token | None]]:
    """(flag, value) pairs as vLLM's argparse reads them: `--flag=value` split; a flag before another flag has none."""
    pairs: list[tuple[Token, Token | None]] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token.text.startswith("--") and "=" in token.text:
            flag, value = token.text.split("=", 1)
            pairs.append((retext(token, flag), retext(token, value, shift=len(flag) + 1)))
            index += 1
            continue
        following = tokens[index + 1] if index + 1 < len(tokens) else None
        takes_value = token.text not in SWITCHES and following is not None and (
            not following.text.startswith("-") or is_number(following.text))
        pairs.append((token, following if takes_value else None))
        index += 2 if takes_value else 1
    return pairs


def read(tokens: list[Token]) -> tuple[LaunchSpec, list[Finding]]:
    """A vLLM launch line (program dropped) read as vLLM's argparse reads it."""
    spec, findings = LaunchSpec(NAME, unstated_k=UNSTATED_K), []
    if tokens and not tokens[0].text.startswith("-"):
        spec.model = tokens[0]
        tokens = tokens[1:]
    config: tuple[Token, dict[str, Any]] | None = None
    for flag, value in _pairs(tokens):
        row = options.by_flag().get(flag.text)
        if flag.text in REMOVED:
            hint = REMOVED[flag.text] or ("pass the drafter through --speculative-config "
                                               "'{\"method\": ..., \"model\": ..., \"num_speculative_tokens\": N}'")
            findings.append(finding("PWR456", flag, f"{flag.text} was removed from vLLM: it stops at start with "
                                     f"`unrecognized arguments: {flag.text}`", hint))
        elif row is None:
            findings.append(finding(
                "PWR446", flag, f"Power does not read the vLLM argument {flag.text}: it is not carried into the plan",
                "drop it, or check it changes neither what is loaded nor what a request returns, and set it on the "
                "rendered command yourself", Severity.WARNING))
        elif row.disposition == REFUSED:
            findings += _refused_word(row, flag, value)
        elif row.disposition == NO_EFFECT:
            continue
        elif SETTINGS.field_of_flag(flag.text) == "eager":
            spec.cuda_graphs, spec.given["cuda_graphs"] = False, flag
        elif value is None:
            continue
        elif (field := SETTINGS.field_of_flag(flag.text)) is not None and (
            read := SETTINGS.reader(field)
        ) is not None:  # the settings table, flag -> field
            spec.given[field] = flag
            setattr(spec, field, read(value, findings))
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
        findings += _read_config(spec, *config)
    return spec, findings


def _read_config(spec: LaunchSpec, where: Token, config: dict[str, Any]) -> list[Finding]:
    method = str(config.get("method", ""))
    if method in modes.FOREIGN_VLLM_METHODS:
        return [finding("PWR455", where, f"Power has no adapter for the vLLM method {method!r}",
                         "plan it as mtp, dflash, dspark or ngram, or keep it outside Power")]
    if method not in modes.BY_VLLM_METHOD:
        return [finding("PWR455", where, f"unknown speculative method {method!r} in --speculative-config",
                         "known: " + ", ".join(sorted(modes.BY_VLLM_METHOD)))]
    spec.mode = modes.BY_VLLM_METHOD[method]
    spec.chain = [spec.mode]
    findings: list[Finding] = []
    tokens = config.get("num_speculative_tokens")
    spec.k = None if tokens is None else read_int(retext(where, str(tokens)), findings)
    if config.get("model") and runs_a_file(spec.mode):
        spec.draft_model = retext(where, str(config["model"]))
    if spec.mode not in modes.WEIGHT_FREE:
        return findings
    # vLLM's prompt lookup tries match lengths from prompt_lookup_max down to prompt_lookup_min (default 1).
    longest, shortest = config.get("prompt_lookup_max"), config.get("prompt_lookup_min", 1)
    spec.ngram_match, spec.ngram_draft_min, spec.ngram_draft_max = longest, 1, spec.k
    if longest is not None and shortest != longest:
        findings.append(finding(
            "PWR455", where, f"prompt lookup over match lengths {shortest}..{longest}: Power's n-gram matches one "
            f"length (llama.cpp's n-match); imported as ngram_match = {longest}",
            "set prompt_lookup_min = prompt_lookup_max to run the same lookup on both engines", Severity.WARNING))
    return findings


def _json_object(token: Token, findings: list[Finding]) -> dict[str, Any] | None:
    try:
        value = parse_json(token.text)
    except DocumentError as err:
        findings.append(finding("PWR457", token, f"--speculative-config cannot be read: {err.message}",
                                 "quote the whole object for the shell: --speculative-config '{\"method\": ...}'"))
        return None
    if not isinstance(value, dict):
        findings.append(finding("PWR457", token, "--speculative-config is not a JSON object",
                                 "pass an object: '{\"method\": ..., \"num_speculative_tokens\": N}'"))
        return None
    return value
