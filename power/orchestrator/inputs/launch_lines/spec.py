"""What an imported launch line asks for, in Power's terms, and how its words read: the vocabulary every engine's
launch-line reader (`power.orchestrator.engines.<engine>.reader`) fills and `power.orchestrator.launch.importer` turns
into a manifest and a profile.

A reader turns each option's value word into a setting through the reader its settings table names (`read_int`,
`read_float`, ...); a word that does not read is a finding at that word (PWR459), never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from power import modes
from power.findings import Finding, Severity
from power.orchestrator.inputs.launch_lines.tokens import Token

# How one value word reads into a setting; a word that does not read appends its finding and gives None.
ValueReader = Callable[[Token, list[Finding]], Any]


@dataclass
class LaunchSpec:
    """What the launch line asks for, in Power's terms (None: the engine's default, filled in by its reader)."""

    engine: str
    model: Token | None = None
    draft_model: Token | None = None
    mode: str = modes.NONE
    chain: list[str] = field(default_factory=list)
    k: int | None = None
    unstated_k: int = 1  # K where the line states none: the engine's default, as its reader knows it
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


def runs_a_file(mode: str) -> bool:
    """Whether the mode runs a drafter given by file (`-md`, or `model` in vLLM's config)."""
    return mode != modes.NONE and modes.mode(mode).file_backed


def sidecar(mode: str) -> bool:
    """Whether the mode's head may come as its own file (`--spec-draft-model MTP-only.gguf --spec-type draft-mtp`)."""
    return mode != modes.NONE and modes.mode(mode).sidecar


def finding(code: str, token: Token | None, message: str, hint: str, severity: Severity = Severity.ERROR) -> Finding:
    """A finding at the word it is about (or at no place, for a line that lacks something)."""
    if token is None:
        return Finding(code=code, severity=severity, message=message, hint=hint)
    return Finding(code=code, severity=severity, message=message, hint=hint, file=token.file, line=token.line,
                   col=token.col, source_line=token.source_line)


def retext(token: Token, text: str, shift: int = 0) -> Token:
    """Part of a word (`--flag=value`'s value, a JSON field) as a token of its own, `shift` columns along."""
    return Token(text, token.file, token.line, token.col + shift, token.source_line, token.env)


def is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_int(token: Token, findings: list[Finding]) -> int | None:
    try:
        return int(token.text)
    except ValueError:
        findings.append(finding("PWR459", token, f"expected a whole number, found {token.text!r}",
                                "write the value as digits"))
        return None


def read_float(token: Token, findings: list[Finding]) -> float | None:
    if is_number(token.text):
        return float(token.text)
    findings.append(finding("PWR459", token, f"expected a number, found {token.text!r}", "write the value as digits"))
    return None


def read_token(token: Token, findings: list[Finding]) -> Token:  # noqa: ARG001 - the readers share one signature
    """The word itself, kept with its place (a model path a later finding points at)."""
    return token


def read_text(token: Token, findings: list[Finding]) -> str:  # noqa: ARG001
    return token.text
