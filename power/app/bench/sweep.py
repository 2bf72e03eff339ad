"""Plan variants for `power bench --sweep`: the reference "sweep the depth, and the n-gram window in the same run".

A variant is the candidate plan recompiled from the files it was compiled from
(the plan's `sources`, checked unchanged by sha256) with one or more profile
settings replaced: `k` (K, with S = K and the verification shape at least K+1),
`ngram_match`, `ngram_draft_min`, `ngram_draft_max`, or `window` (the reference
"48/64": `ngram_draft_min/ngram_draft_max`). Several `--sweep` options combine
(every combination); for n-gram alone a window's longest draft is also K. Each variant's profile is written as a TOML
file beside its plan and loaded like any profile, so every rule and check runs on it; a variant
that does not compile is refused with its findings, never skipped.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from pathlib import Path
from typing import Any

import tomli_w

from power import modes
from power.documents.plan import ResolvedPlan, save_plan
from power.findings import PowerError, has_errors
from power.orchestrator.inputs.loading import load_manifest, load_profile
from power.orchestrator.inputs.schema import DeviceSpec, HostSpec
from power.orchestrator.planning.compile import ArtifactMemo, compile_plan

# sweep name -> how its value reads; `window` sets two keys.
SETTINGS = ("k", "ngram_match", "ngram_draft_min", "ngram_draft_max", "window")
_WINDOW = re.compile(r"^(\d+)/(\d+)$")


class SweepError(PowerError):
    """A sweep that cannot be built: a bad --sweep value, changed sources, or a variant that does not compile."""

    code = "PWR078"


def parse(texts: list[str]) -> list[dict[str, Any]]:
    """`["k=3,5", "window=2/7,48/64"]` -> every combination, each a {setting: value} dict."""
    axes = []
    for text in texts:
        name, _, values = text.partition("=")
        name = name.strip()
        if name not in SETTINGS or not values.strip():
            raise SweepError(f"--sweep {text!r}: write SETTING=V1,V2,... with SETTING one of {', '.join(SETTINGS)}",
                             hint="e.g. --sweep k=3,5,7 --sweep window=2/7,48/64")
        axes.append([(name, _value(name, value.strip(), text)) for value in values.split(",") if value.strip()])
    return [dict(combination) for combination in itertools.product(*axes)]


def _value(name: str, value: str, text: str) -> Any:
    if name == "window":
        match = _WINDOW.match(value)
        if match is None:
            raise SweepError(f"--sweep {text!r}: a window is MIN/MAX draft lengths, e.g. 48/64")
        return int(match.group(1)), int(match.group(2))
    if not value.isdigit() or int(value) < 1:
        raise SweepError(f"--sweep {text!r}: {value!r} is not a whole number >= 1")
    return int(value)


def label(overrides: dict[str, Any]) -> str:
    """`k=5 window=48/64`: how a variant is named in tables and evidence."""
    return " ".join(f"{name}={'/'.join(map(str, value)) if isinstance(value, tuple) else value}"
                    for name, value in overrides.items())


def variants(plan: ResolvedPlan, combinations: list[dict[str, Any]], folder: Path
             ) -> list[tuple[str, Path, ResolvedPlan]]:
    """Each combination's label, plan path and plan: the plan recompiled with it, written (with its profile) into
    `folder`; SweepError if one cannot be. The sources are checked once, and each artifact is read once for all."""
    sources = plan.sources
    for role, ref in (("manifest", sources.manifest), ("profile", sources.profile)):
        path = Path(ref.path)
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != ref.sha256:
            raise SweepError(f"the {role} the plan was compiled from changed or is gone", file=str(path),
                             hint="recompile the plan with `power plan`, then sweep it")
    profile = load_profile(sources.profile.path)
    if not profile.ok:
        raise SweepError("the plan's profile no longer loads", file=sources.profile.path)
    memo = ArtifactMemo()
    return [(label(overrides), *_variant(plan, profile.model, overrides, folder, memo)) for overrides in combinations]


def _variant(plan: ResolvedPlan, profile: Any, overrides: dict[str, Any], folder: Path, memo: ArtifactMemo
             ) -> tuple[Path, ResolvedPlan]:
    sources = plan.sources
    name = label(overrides)
    if plan.mode.resolved in modes.WEIGHT_FREE and "window" in overrides and "k" not in overrides:
        overrides = {**overrides, "k": overrides["window"][1]}  # n-gram alone: its longest draft is K
    document = _profile_document(profile, overrides, name)
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", name)
    folder.mkdir(parents=True, exist_ok=True)
    profile_path = folder / f"{stem}.profile.toml"
    profile_path.write_text(tomli_w.dumps(document))
    compiled, findings = compile_plan(load_manifest(sources.manifest.path), load_profile(profile_path),
                                      _host_of(plan), tuple(d.index for d in plan.devices), artifacts=memo,
                                      engine=plan.memory.engine)
    if compiled is None or has_errors(findings):
        first = next(f for f in findings if f.is_error)
        raise SweepError(f"the variant {name} does not compile: {first.code} {first.message}", file=str(profile_path),
                         hint=first.hint or "drop that value from --sweep")
    plan_path = folder / f"{stem}.plan.json"
    save_plan(compiled, plan_path)
    return plan_path, compiled


def _host_of(plan: ResolvedPlan) -> HostSpec:
    """A host with the plan's devices at their indices (the variant is sized and placed as the plan was)."""
    by_index = {device.index: device for device in plan.devices}
    devices = [by_index.get(index, plan.devices[0]) for index in range(max(by_index) + 1)]
    return HostSpec(name="bench", devices=[DeviceSpec(model=d.name, vram=d.vram_bytes, kind=d.kind) for d in devices],
                    headroom=plan.devices[0].headroom_bytes)


def _profile_document(model: Any, overrides: dict[str, Any], name: str) -> dict[str, Any]:
    document = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    document["name"] = f"{model.name} {name}"
    runtime = document.setdefault("runtime", {})
    for setting, value in overrides.items():
        if setting == "k":
            document["spec_draft_max"] = document["spec_mtp_recurrent_snapshots"] = value
            runtime["verify_capacity"] = max(runtime.get("verify_capacity") or 0, value + 1)
        elif setting == "window":
            runtime["ngram_draft_min"], runtime["ngram_draft_max"] = value
        else:
            runtime[setting] = value
    return document


def section(documents: list[dict], labels: list[str], best: dict | None) -> dict:
    """The evidence's `sweep` section: each variant's figures per shape, and which won (None: the incumbent stays)."""
    variants = []
    for label, document in zip(labels, documents, strict=True):
        variants.append({
            "label": label, "plan_digest": document["candidate"]["plan_digest"], "plan": document["candidate"]["plan"],
            "k": document["candidate"]["k"], "ngram": document["candidate"]["ngram"],
            "lossless": document["lossless"]["proven"],
            "shapes": {name: {"decode_tok_s": r["candidate"]["decode_tok_s"], "speedup": r.get("speedup"),
                              "request_tok_s": r["candidate"]["request_tok_s"],
                              "request_speedup": r.get("request_speedup"),
                              "acceptance": r["candidate"]["acceptance"], "verdict": r["verdict"]}
                       for name, r in document["shapes"].items()},
        })
    winner = next((label for label, d in zip(labels, documents, strict=True) if d is best), None)
    return {"variants": variants, "winner": winner,
            "rule": "lossless, never slower on a shape, faster on one; then the best geometric-mean speedup"}


def table(section: dict) -> str:
    """The sweep section as the lines printed above the bench's table."""
    shapes = list(section["variants"][0]["shapes"]) if section["variants"] else []
    lines = ["sweep: " + "  ".join(["variant".ljust(22), *(s.ljust(24) for s in shapes), "lossless"])]
    for v in section["variants"]:
        cells = [f"{r['decode_tok_s']:.2f} ({r['speedup']:.2f}x {r['verdict']})" if r.get("speedup")
                 else f"{r['decode_tok_s']:.2f} ({r['verdict']})" for r in v["shapes"].values()]
        lines.append("       " + "  ".join([v["label"].ljust(22), *(c.ljust(24) for c in cells),
                                            "yes" if v["lossless"] else "no"]))
    lines.append(f"winner: {section['winner'] or 'none: no variant won on every shape; the incumbent stays'}")
    return "\n".join(lines) + "\n"
