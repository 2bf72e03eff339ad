"""Mode resolution: which drafters a plan runs, failing closed.

- `none`: no drafter.
- `auto`: only what is known to win (`power.modes`: a mode with an
  `auto_priority`; the reference opt-in modes, DFlash2 and DSpark, must be named),
  by priority: a verified external artifact; otherwise native MTP when the
  target carries its head (or the manifest names an MTP-only sidecar); otherwise
  weight-free n-gram; otherwise none. Two candidates of the same priority make
  `auto` ambiguous: the profile must name one. How auto resolved, and why, is
  the info finding PWR217.
- an explicit mode needs the manifest to declare that drafter (and, for `mtp`,
  the target to carry nextn tensors or a sidecar file); otherwise it is an
  error, never a downgrade.
- a reserved mode (`draft-model`) has no production adapter, so it fails closed.
- at most one context-backed drafter runs; a manifest's weight-free n-gram
  drafter chains in front of it (llama.cpp runs n-gram types first, then the
  drafter), except that `auto` never builds a chain the reference measurements (docs/reference.md) found as a loss
  (n-gram in front of a drafter on a recurrent target, `power.modes` chain_loss);
  an explicit mode that builds it gets a warning with the measurement.

Drafters reach resolution only after their artifact checks passed: a drafter
whose file failed is an error finding already, so `auto` never skips past it.
"""

from __future__ import annotations

from dataclasses import dataclass

from power import modes
from power.findings import Finding, Severity
from power.orchestrator.inputs.loading import Loaded

# Why `auto` chose a drafter, by where its weights live.
AUTO_REASONS = {
    "file": "auto: the manifest's verified external {kind} artifact",
    "target": "auto: no external artifact; the target carries native {kind_upper}",
    "none": "auto: no external artifact or native MTP; weight-free n-gram (it proposes only where text repeats)",
}
AUTO_SIDECAR_REASON = "auto: no external artifact; the manifest's MTP-only sidecar carries the target's MTP head"


@dataclass(frozen=True)
class Resolution:
    requested: str
    resolved: str
    # manifest drafter indices in execution order (n-gram first); the native MTP head has its manifest entry too
    drafters: tuple[int, ...]
    chain: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class Declared:
    """The manifest's drafters as resolution sees them: each kind, and whether its weights are there to run."""

    kinds: list[str]
    runnable: list[bool]  # False for an `mtp` entry whose target has no head and that names no sidecar
    sidecar: list[bool]  # an `mtp` entry that names its own file (an MTP-only GGUF)


def resolve(requested: str, declared: Declared, manifest: Loaded, profile: Loaded,
            recurrent_target: bool) -> tuple[Resolution | None, list[Finding]]:
    """The resolution of `requested` (the profile's spec_mode) over the manifest's declared drafters."""
    if requested in modes.BY_NAME and modes.mode(requested).reserved:
        usable = [m.name for m in modes.MODES if not m.reserved] + [modes.AUTO]
        return None, [profile.finding("PWR214", f'spec_mode = "{requested}" is reserved: it has no production adapter, '
                                      "so the plan fails closed", where="spec_mode",
                                      hint=f"use {modes.quoted(usable)}")]
    if requested == modes.NONE:
        return Resolution(requested, "none", (), (), "speculation off"), []
    if requested == modes.AUTO:
        return _auto(declared, manifest, profile, recurrent_target)
    choice, findings = _explicit(requested, declared, manifest, profile)
    if choice is None:
        return None, findings
    resolution, chained = _chained(requested, choice, declared.kinds, "named by the profile's spec_mode", manifest,
                                   recurrent_target, explicit=True)
    return resolution, [*findings, *chained]


def _auto(declared: Declared, manifest: Loaded, profile: Loaded,
          recurrent_target: bool) -> tuple[Resolution | None, list[Finding]]:
    kinds = declared.kinds
    for allowed in modes.auto_tiers():
        candidates = [i for i, kind in enumerate(kinds) if kind in allowed and declared.runnable[i]]
        if len(candidates) > 1 and modes.mode(kinds[candidates[0]]).context_backed:
            named = ", ".join(kinds[i] for i in candidates)
            return None, [profile.finding(
                "PWR215", f'spec_mode = "auto" would load one of several context-backed drafters ({named}); '
                "two never run together and auto will not guess", where="spec_mode",
                hint="set spec_mode to the one you mean: " + " or ".join(f'"{kinds[i]}"' for i in candidates))]
        if candidates:
            index = candidates[0]
            resolution, chained = _chained(modes.AUTO, index, kinds, _auto_reason(kinds[index], declared, index),
                                           manifest, recurrent_target, explicit=False)
            return resolution, [*chained, _auto_finding(profile, resolution, kinds)]
    resolution = Resolution(modes.AUTO, modes.NONE, (), (), "auto: nothing known to win (no external artifact auto "
                            "may choose, no native MTP, no n-gram): speculation off")
    return resolution, [_auto_finding(profile, resolution, kinds)]


def _auto_reason(kind: str, declared: Declared, index: int) -> str:
    if declared.sidecar[index]:
        return AUTO_SIDECAR_REASON
    return AUTO_REASONS[modes.mode(kind).artifact].format(kind=kind, kind_upper=kind.upper())


def _auto_finding(profile: Loaded, resolution: Resolution, kinds: list[str]) -> Finding:
    """PWR217: what auto chose and why, and every declared drafter it passed over (each needs an explicit mode)."""
    passed = [(kind, modes.mode(kind).opt_in) for kind in dict.fromkeys(kinds)
              if kind not in resolution.chain and modes.mode(kind).opt_in]
    chain = " -> ".join(resolution.chain) or "no speculation"
    message = f'spec_mode = "auto" resolved to {chain}: {resolution.reason.removeprefix("auto: ")}'
    if passed:
        message += "; passed over " + "; ".join(f"{kind} ({why})" for kind, why in passed)
    named = " or ".join(f'spec_mode = "{kind}"' for kind, _ in passed)
    hint = f"to run a drafter auto passes over, name it: {named}" if passed else None
    return profile.finding("PWR217", message, where="spec_mode", hint=hint)


def _explicit(requested: str, declared: Declared, manifest: Loaded, profile: Loaded):
    kinds = declared.kinds
    matches = [i for i, kind in enumerate(kinds) if kind == requested]
    if not matches:
        listed = ", ".join(sorted(set(kinds))) or "none"
        return None, [profile.finding(
            "PWR216", f'spec_mode = "{requested}" but the manifest {manifest.path.name} declares no '
                      f'{requested} drafter '
            f"(it declares: {listed}); Power never downgrades to another mode", where="spec_mode",
            hint=f'add a [[drafters]] entry with kind = "{requested}" to the manifest, or pick a mode it serves '
            '(or "auto")')]
    if len(matches) > 1:
        return None, [manifest.finding(
            "PWR215", f"the manifest declares {len(matches)} {requested} drafters; a plan runs exactly one",
            where=f"drafters[{matches[1]}].kind", hint=f"keep one {requested} entry per manifest")]
    if not declared.runnable[matches[0]]:
        # The target's contract check reports PWR212 at the artifact; nothing to resolve.
        return None, []
    return matches[0], []


def _chained(requested: str, index: int, declared: list[str], reason: str, manifest: Loaded,
             recurrent_target: bool, explicit: bool) -> tuple[Resolution, list[Finding]]:
    kind = declared[index]
    weight_free = [i for i, declared_kind in enumerate(declared) if declared_kind in modes.WEIGHT_FREE]
    if kind in modes.WEIGHT_FREE or not weight_free:
        return Resolution(requested, kind, (index,), (kind,), reason), []
    ngram = weight_free[0]
    loss = modes.mode(declared[ngram]).chain_loss if recurrent_target else None
    if loss and not explicit:
        return Resolution(requested, kind, (index,), (kind,), f"{reason}; {declared[ngram]} not chained in front of "
                          f"it on this recurrent target ({loss})"), []
    note = manifest.finding(
        "PWR218", f"weight-free {declared[ngram]} chained in front of {kind} (n-gram proposes first, then the drafter)"
        + (f": {loss}" if loss else ""), where=f"drafters[{ngram}].kind",
        severity=Severity.WARNING if loss else None,
        hint="measure both arms with `power bench --engine llama-server` before deploying the chain; drop the ngram "
        "drafter from the manifest to run the drafter alone" if loss else None)
    return Resolution(requested, kind, (ngram, index), (declared[ngram], kind), reason), [note]
