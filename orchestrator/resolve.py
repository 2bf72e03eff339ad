"""Mode resolution: which drafters a plan runs, failing closed.

- `none`: no drafter.
- `auto`: the manifest's drafters that `power.modes` lets auto choose, by
  priority: a verified external artifact wins; otherwise native MTP when the
  target carries it; otherwise weight-free n-gram; otherwise none. Two
  candidates of the same priority make `auto` ambiguous: the profile must name one.
- an explicit mode needs the manifest to declare that drafter (and, for `mtp`,
  the target to carry nextn tensors); otherwise it is an error, never a downgrade.
- a reserved mode (`draft-model`) has no production adapter, so it fails closed.
- at most one context-backed drafter runs; a manifest's weight-free n-gram
  drafter chains in front of it (llama.cpp runs n-gram types first, then the drafter).

Drafters reach resolution only after their artifact checks passed: a drafter
whose file failed is an error finding already, so `auto` never skips past it.
"""

from __future__ import annotations

from dataclasses import dataclass

from power import modes
from power.findings import Finding
from power.orchestrator.loading import Loaded

# Why `auto` chose a drafter, by where its weights live.
AUTO_REASONS = {
    "file": "auto: the manifest's verified external {kind} artifact",
    "target": "auto: no external artifact; the target carries native {kind_upper}",
    "none": "auto: no external artifact or native MTP; weight-free n-gram",
}


@dataclass(frozen=True)
class Resolution:
    requested: str
    resolved: str
    # manifest drafter indices in execution order (n-gram first); the native MTP head has its manifest entry too
    drafters: tuple[int, ...]
    chain: tuple[str, ...]
    reason: str


def resolve(requested: str, declared: list[str], target_has_mtp: bool, manifest: Loaded, profile: Loaded,
            recurrent_target: bool) -> tuple[Resolution | None, list[Finding]]:
    """The resolution of `requested` (the profile's spec_mode) over the manifest's declared drafter kinds."""
    if requested in modes.BY_NAME and modes.mode(requested).reserved:
        usable = [m.name for m in modes.MODES if not m.reserved] + [modes.AUTO]
        return None, [profile.finding("PWR214", f'spec_mode = "{requested}" is reserved: it has no production adapter, '
                                      "so the plan fails closed", where="spec_mode",
                                      hint=f"use {modes.quoted(usable)}")]
    if requested == modes.NONE:
        return Resolution(requested, "none", (), (), "speculation off"), []
    if requested == modes.AUTO:
        choice, findings = _auto(declared, target_has_mtp, profile)
    else:
        choice, findings = _explicit(requested, declared, target_has_mtp, manifest, profile)
    if choice is None:
        return None, findings
    index, reason = choice
    return _chained(requested, index, declared, reason, manifest, recurrent_target, findings)


def _auto(declared: list[str], target_has_mtp: bool, profile: Loaded):
    for kinds in modes.auto_tiers():
        candidates = [i for i, kind in enumerate(declared)
                      if kind in kinds and (modes.mode(kind).artifact != "target" or target_has_mtp)]
        if len(candidates) > 1 and modes.mode(declared[candidates[0]]).context_backed:
            named = ", ".join(declared[i] for i in candidates)
            return None, [profile.finding(
                "PWR215", f'spec_mode = "auto" would load one of several context-backed drafters ({named}); '
                "two never run together and auto will not guess", where="spec_mode",
                hint="set spec_mode to the one you mean: " + " or ".join(f'"{declared[i]}"' for i in candidates))]
        if candidates:
            kind = declared[candidates[0]]
            reason = AUTO_REASONS[modes.mode(kind).artifact].format(kind=kind, kind_upper=kind.upper())
            return (candidates[0], reason), []
    return (None, "auto: no external artifact, no native MTP, no n-gram: speculation off"), []


def _explicit(requested: str, declared: list[str], target_has_mtp: bool, manifest: Loaded, profile: Loaded):
    matches = [i for i, kind in enumerate(declared) if kind == requested]
    if not matches:
        listed = ", ".join(sorted(set(declared))) or "none"
        return None, [profile.finding(
            "PWR216", f'spec_mode = "{requested}" but the manifest {manifest.path.name} declares no {requested} drafter '
            f"(it declares: {listed}); Power never downgrades to another mode", where="spec_mode",
            hint=f'add a [[drafters]] entry with kind = "{requested}" to the manifest, or pick a mode it serves '
            '(or "auto")')]
    if len(matches) > 1:
        return None, [manifest.finding(
            "PWR215", f"the manifest declares {len(matches)} {requested} drafters; a plan runs exactly one",
            where=f"drafters[{matches[1]}].kind", hint=f"keep one {requested} entry per manifest")]
    if modes.mode(requested).artifact == "target" and not target_has_mtp:
        # The target's contract check reports PWR212 at the artifact; nothing to resolve.
        return None, []
    return (matches[0], "named by the profile's spec_mode"), []


def _chained(requested: str, index: int | None, declared: list[str], reason: str, manifest: Loaded,
             recurrent_target: bool, findings: list[Finding]) -> tuple[Resolution, list[Finding]]:
    if index is None:
        return Resolution(requested, "none", (), (), reason), findings
    kind = declared[index]
    weight_free = [i for i, declared_kind in enumerate(declared) if declared_kind in modes.WEIGHT_FREE]
    if kind in modes.WEIGHT_FREE or not weight_free:
        return Resolution(requested, kind, (index,), (kind,), reason), findings
    ngram = weight_free[0]
    note = manifest.finding(
        "PWR218", f"weight-free {declared[ngram]} chained in front of {kind} (n-gram proposes first, then the drafter)",
        where=f"drafters[{ngram}].kind",
        hint="on a recurrent target llama.cpp disables rollback with n-gram in the chain: measure both arms"
        if recurrent_target else None)
    return Resolution(requested, kind, (ngram, index), (declared[ngram], kind), reason), [*findings, note]
