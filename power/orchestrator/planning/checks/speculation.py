"""PWR42x: speculation settings that only the resolved mode and the artifacts can judge.

Settings the profile alone decides (K and S ranges, S vs K, FR or adaptive with
an explicit mode that cannot use them) are the loader's rules (PWR40x/41x); here
are the ones that depend on what `auto` resolved to or on header facts.
"""

from __future__ import annotations

from power import modes
from power.findings import Finding
from power.orchestrator.inputs.loading import Loaded


def check_speculation(profile: Loaded, resolved: str, block: int | None, vocab_size: int) -> list[Finding]:
    """`block`: the resolved block drafter's block size (its GGUF header's, or its checkpoint's config.json's)."""
    settings = profile.model
    findings = []
    fr = settings.spec_mtp_fr_vocab_size
    if fr is not None and vocab_size and fr > vocab_size:
        findings.append(profile.finding(
            "PWR422", f"spec_mtp_fr_vocab_size = {fr:,} exceeds the target's vocabulary of {vocab_size:,} tokens",
            where="spec_mtp_fr_vocab_size", hint=f"use at most {vocab_size}, or omit it for the full vocabulary"))
    if fr is not None and (resolved == modes.NONE or not modes.mode(resolved).fr):
        findings.append(profile.finding(
            "PWR423", f'spec_mtp_fr_vocab_size is set but the mode resolved to "{resolved}", which has no draft head '
            "whose projection FR could cut", where="spec_mtp_fr_vocab_size",
            hint='remove spec_mtp_fr_vocab_size, or set spec_mode = "mtp" on a target with an MTP head'))
    if block and resolved in modes.ARCHITECTURE_OF:
        if settings.spec_draft_max > block - 1:
            findings.append(profile.finding(
                "PWR425", f"spec_draft_max = {settings.spec_draft_max} but the {resolved} drafter proposes at most "
                f"{block - 1} tokens per block (block_size {block} = anchor + {block - 1} drafts)",
                where="spec_draft_max", hint=f"set spec_draft_max to {block - 1} or less"))
    findings += _ngram_width(profile, resolved)
    p_min = settings.spec_draft_p_min
    if p_min is not None and (resolved == modes.NONE or resolved not in modes.CONFIDENCE_GATED):
        gated = ", ".join(sorted(modes.CONFIDENCE_GATED))
        findings.append(profile.finding(
            "PWR426", f'spec_draft_p_min = {p_min:g} but the mode resolved to "{resolved}", whose Power speculator has '
            f"no confidence gate: the engines would draft differently (only {gated} gates its drafts by it)",
            where="spec_draft_p_min", hint="remove spec_draft_p_min, or name a mode that gates its drafts"))
    return findings


def _ngram_width(profile: Loaded, resolved: str) -> list[Finding]:
    """An n-gram plan verifies at most K drafts per round in Power's runtime: its longest draft must fit."""
    settings = profile.model
    longest = settings.runtime.ngram_draft_max
    if resolved not in modes.WEIGHT_FREE or longest is None or longest <= settings.spec_draft_max:
        return []
    return [
        profile.finding(
            "PWR427",
            f"ngram_draft_max = {longest} but K = spec_draft_max = {settings.spec_draft_max}: Power's runtime "
            f"verifies at most K drafts per round while llama-server would draft {longest}",
            where="runtime.ngram_draft_max",
            hint=f"set spec_draft_max = {longest} (the n-gram's longest draft is K), or lower ngram_draft_max",
        )
    ]
