"""Rules across fields that need no artifact: S vs K, FR vs mode, adaptive vs mode, drafter files.

They read the raw TOML data rather than a validated model, so that a file with a
bad field still gets every other finding in the same run: a rule runs when the
fields it relates are individually valid (or absent, taking their defaults).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, TypeGuard

from pydantic import BaseModel

from power import modes
from power.artifacts import provenance
from power.artifacts.checkpoint import CONFIG as CHECKPOINT_CONFIG
from power.orchestrator.inputs.locator import KeyPath, format_where
from power.orchestrator.inputs.schema import Profile, ProfileRuntime


@dataclass(frozen=True)
class Issue:
    """A rule's verdict, located by key path; the loader turns it into a located Finding."""

    code: str
    message: str
    where: KeyPath
    hint: str | None = None
    severity: str | None = None  # None: the code's default severity


def check(kind: str, data: dict[str, Any]) -> list[Issue]:
    checker = {"manifest": _manifest, "profile": _profile}.get(kind)
    return checker(data) if checker else []


# --- manifest -----------------------------------------------------------------


def _manifest(data: dict[str, Any]) -> list[Issue]:
    target = data.get("target")
    issues = _target_digest(target) if isinstance(target, dict) else []
    issues += [issue for where, entry in _artifacts(data) for issue in _source(where, entry)]
    drafters = data.get("drafters")
    if not isinstance(drafters, list):
        return issues
    for index, drafter in enumerate(drafters):
        if isinstance(drafter, dict):
            issues += _drafter(index, drafter)
    return issues


def _artifacts(data: dict[str, Any]) -> list[tuple[KeyPath, dict[str, Any]]]:
    """Each artifact table with its key path: the target, then each drafter."""
    found: list[tuple[KeyPath, dict[str, Any]]] = []
    if isinstance(data.get("target"), dict):
        found.append((("target",), data["target"]))
    drafters = data.get("drafters")
    if isinstance(drafters, list):
        found += [(("drafters", index), entry) for index, entry in enumerate(drafters) if isinstance(entry, dict)]
    return found


def _target_digest(target: dict[str, Any]) -> list[Issue]:
    """The target's sha256 is required: drafters bind to it. With a source, `power pull --pin` writes it."""
    if "sha256" in target:
        return []
    if isinstance(target.get("source"), dict):
        return []  # PWR132 names the fix for a sourced artifact
    return [Issue("PWR021", "[target] has no sha256: a required key is missing", ("target", "sha256"),
                  hint="add `sha256 = ...` (`sha256sum FILE`), or name its [target.source] and run `power pull --pin`")]


def _source(where: KeyPath, entry: dict[str, Any]) -> list[Issue]:
    """PWR130-PWR133: a source is a Hub repository pinned to a commit or an https URL, and the artifact it
    names carries the size and sha256 a pull checks the bytes against."""
    source = entry.get("source")
    if not isinstance(source, dict):
        return []
    here = where + ("source",)
    repo, url = source.get("repo"), source.get("url")
    if (repo is None) == (url is None):
        return [Issue("PWR130", f"{format_where(here)} names "
                                f"{'both `repo` and `url`' if repo else 'neither `repo` nor `url`'}",
                      here, hint='give either `repo = "owner/name"` with `revision` (a Hugging Face repository) '
                      'or `url = "https://..."`')]
    if url is not None and "files" in entry:
        return [Issue("PWR130", f"{format_where(here)} gives a `url`, but a checkpoint folder is published as a "
                      "repository", here + ("url",), hint='give `repo = "owner/name"` and `revision` instead')]
    if url is not None:
        return _url_source(here, source, url) + _digests(where, entry)
    revision = source.get("revision")
    issues = [] if provenance.is_commit(revision) else [Issue(
        "PWR131", f"{format_where(here)}.revision "
        f"{'is missing' if revision is None else f'is {revision!r}, a branch or tag'}: it is not pinned to a commit, "
        "so the bytes it names can change", here + (("revision",) if revision else ()),
        hint="run `power pull --pin MANIFEST`: it resolves the revision to its commit id and writes it here")]
    return issues + _digests(where, entry)


def _url_source(here: KeyPath, source: dict[str, Any], url: Any) -> list[Issue]:
    stray = [key for key in ("revision", "filename") if key in source]
    if stray:
        return [
            Issue(
                "PWR130",
                f"{format_where(here)} gives a `url` and "
                f"{_and(f'`{key}`' for key in stray)}, which only a Hub repository has",
                here + (stray[0],),
                hint=f"remove {_and(stray)}, or use `repo` instead of `url`",
            )
        ]
    if isinstance(url, str) and not provenance.is_secure(url):
        return [Issue("PWR133", f"{format_where(here)}.url is not https: {url}", here + ("url",),
                      hint="use the https:// address (plain http only to a loopback address such as 127.0.0.1)")]
    return []


def _digests(where: KeyPath, entry: dict[str, Any]) -> list[Issue]:
    if "files" in entry:
        return []  # a checkpoint's files carry their own (`_checkpoint`)
    missing = [key for key in ("size", "sha256") if key not in entry]
    if not missing:
        return []
    return [Issue("PWR132", f"{format_where(where)} names a source but no {_and(missing)}: a pull could not tell the "
                  "published file from any other", where + ("source",),
                  hint="run `power pull --pin MANIFEST`: it fetches the file and writes its size and sha256 here")]


def _drafter(index: int, drafter: dict[str, Any]) -> list[Issue]:
    kind = drafter.get("kind")
    if kind not in modes.DRAFTER_KINDS:
        return []
    here: KeyPath = ("drafters", index)
    if "files" in drafter:
        return _checkpoint(here, kind, drafter)
    if kind in modes.CHECKPOINT_ONLY:
        return [Issue("PWR025", f"a {kind} drafter is a Hugging Face checkpoint folder (what vLLM loads), but this "
                      "entry lists no `files`", here + ("kind",),
                      hint="name the checkpoint's folder in `path` and each of its files in `files` (config.json "
                           "among them), with target_sha256 and a [drafters.source] (docs/files.md)")]
    if kind in modes.FILE_BACKED or (modes.mode(kind).sidecar and "path" in drafter):
        missing = [key for key in ("path", "sha256", "target_sha256") if key not in drafter]
        if missing:
            return [
                Issue(
                    "PWR025",
                    f"a {kind} drafter{' sidecar' if kind not in modes.FILE_BACKED else ''} is a separate GGUF file, "
                    f"but this entry has no {_and(missing)}",
                    here + ("kind",),
                    hint=f"add {_and(f'`{key} = ...`' for key in missing)} to this [[drafters]] entry "
                    "(target_sha256 is the sha256 of the target it was built for)",
                )
            ]
        return []
    stray = [key for key in ("path", "size", "sha256", "target_sha256", "quant") if key in drafter]
    if stray:
        in_target = modes.mode(kind).artifact == "target"
        reason = ("lives in the target file unless `path` names its sidecar" if in_target and modes.mode(kind).sidecar
                  else "lives in the target file" if in_target else "needs no file")
        return [
            Issue(
                "PWR025",
                f"a {kind} drafter {reason}, but this entry names {_and(stray)}",
                here + (stray[0],),
                hint=f"remove {_and(stray)} from this entry"
                + (
                    f", or use kind {'/'.join(_external_kinds())} if it is a separate drafter file" if in_target else ""
                ),
            )
        ]
    return []


def _checkpoint(here: KeyPath, kind: str, drafter: dict[str, Any]) -> list[Issue]:
    """A drafter given as a Hugging Face checkpoint folder: a file-backed kind, its folder, its binding and its
    files (config.json among them), each file with its own size and sha256 instead of the entry's."""
    if kind not in modes.FILE_BACKED:
        return [Issue("PWR025", f"a {kind} drafter is no checkpoint, but this entry lists `files`", here + ("files",),
                      hint=f"remove `files`, or use kind {'/'.join(_external_kinds())} for a checkpoint drafter")]
    missing = [key for key in ("path", "target_sha256") if key not in drafter]
    stray = [key for key in ("sha256", "size", "quant") if key in drafter]
    files = drafter["files"] if isinstance(drafter["files"], list) else []
    names = [entry.get("name") for entry in files if isinstance(entry, dict)]
    issues = []
    if missing:
        issues.append(Issue("PWR025", f"a {kind} checkpoint drafter has no {_and(missing)}", here + ("kind",),
                            hint="`path` names the checkpoint's folder (relative to the manifest); target_sha256 is "
                                 "the sha256 of the target it was built for"))
    if stray:
        issues.append(Issue("PWR025", f"a checkpoint drafter's files carry their own size and sha256, but this entry "
                            f"names {_and(stray)}", here + (stray[0],), hint=f"remove {_and(stray)} from the entry"))
    if files and CHECKPOINT_CONFIG not in names:
        issues.append(Issue("PWR025", f"a checkpoint drafter's files must include {CHECKPOINT_CONFIG}, which "
                            "names its kind, block size and target", here + ("files",),
                            hint=f'add {{ name = "{CHECKPOINT_CONFIG}", ... }} to `files`'))
    sourced = isinstance(drafter.get("source"), dict)
    for number, entry in enumerate(files):
        absent = [key for key in ("size", "sha256") if isinstance(entry, dict) and key not in entry]
        if absent:
            issues.append(Issue(
                "PWR132" if sourced else "PWR025", f"{format_where(here + ('files', number))} has no {_and(absent)}",
                here + ("files", number), hint="run `power pull --pin MANIFEST` to write them" if sourced else
                "add the file's size and sha256 (`sha256sum FILE`)"))
    return issues


# --- profile ------------------------------------------------------------------


def _profile(data: dict[str, Any]) -> list[Issue]:
    mode = _spec_mode(data.get("spec_mode", modes.AUTO))
    k = _positive_int(data, "spec_draft_max", Profile, upper=64)
    s = _positive_int(data, "spec_mtp_recurrent_snapshots", Profile)
    table = data.get("runtime")
    runtime: dict[str, Any] = table if isinstance(table, dict) else {}
    issues = _fr(data, mode) + _adaptive(data, mode)
    if k is not None:
        issues += _ngram_window(runtime, k)
    if mode is not None and mode in modes.BY_NAME and modes.mode(mode).reserved:
        issues.append(
            Issue(
                "PWR410",
                f"spec_mode = \"{mode}\" is reserved: it has no production adapter, so a plan fails closed",
                ("spec_mode",),
                hint=f'use {modes.quoted(_usable_kinds())}, or "auto" to pick from the manifest',
            )
        )
    if mode is not None and mode != modes.NONE and k is not None and s is not None:
        issues += _snapshots_vs_width(k, s)
    if k is not None:
        issues += _verify_capacity(runtime, k)
    return issues + _batches(runtime) + _tensor_split(runtime) + _draft_overrides(runtime)


def _fr(data: dict[str, Any], mode: str | None) -> list[Issue]:
    fr = data.get("spec_mtp_fr_vocab_size")
    if not _is_int(fr) or fr < 1 or mode is None or mode in modes.FR_SPEC_MODES:
        return []
    where = ("spec_mtp_fr_vocab_size",)
    if mode == modes.AUTO:
        return [
            Issue(
                "PWR404",
                "FR only applies if auto resolves to a mode with a draft head (mtp, dflash, dflash2, dspark); with "
                "n-gram the plan rejects it",
                where,
                hint='set spec_mode to a drafter with a head (e.g. "mtp") to make FR meaningful, or remove '
                     'spec_mtp_fr_vocab_size',
                severity="info",
            )
        ]
    return [
        Issue(
            "PWR404",
            "spec_mtp_fr_vocab_size cuts a draft head's vocabulary projection, but spec_mode = "
            f"\"{mode}\" has no draft head",
            where,
            hint='remove spec_mtp_fr_vocab_size, or use a mode with a draft head (mtp, dflash, dflash2, dspark)',
        )
    ]


def _adaptive(data: dict[str, Any], mode: str | None) -> list[Issue]:
    if data.get("spec_mtp_adaptive") is not True or mode is None or mode in modes.ADAPTIVE_SPEC_MODES:
        return []
    reason = "there is no speculation to adapt" if mode == modes.NONE else modes.mode(mode).fixed_shape
    driven = sorted(modes.ADAPTIVE_SPEC_MODES - {modes.AUTO}, key=modes.DRAFTER_KINDS.index)
    return [
        Issue(
            "PWR405",
            f"spec_mtp_adaptive = true with spec_mode = \"{mode}\": {reason}",
            ("spec_mtp_adaptive",),
            hint=f"set spec_mtp_adaptive = false (the adaptive controller drives {_and(driven)})",
        )
    ]


def _snapshots_vs_width(k: int, s: int) -> list[Issue]:
    where = ("spec_mtp_recurrent_snapshots",)
    if s < k:
        return [
            Issue(
                "PWR406",
                f"S = {s} < K = {k}: guarded path: one exact replay then clamp to S "
                f"(a rejected suffix beyond {s} rows is replayed once, then that request proposes at most {s})",
                where,
                hint=f"set spec_mtp_recurrent_snapshots = {k} to keep a rollback point for every proposal",
            )
        ]
    if s > k:
        return [
            Issue(
                "PWR407",
                f"S = {s} > K = {k}: resident state never used (at most {k} proposals need a rollback point)",
                where,
                hint=f"set spec_mtp_recurrent_snapshots = {k} to free the unused snapshots' memory",
            )
        ]
    return []


def _verify_capacity(runtime: dict[str, Any], k: int) -> list[Issue]:
    capacity = runtime.get("verify_capacity")
    if not _is_int(capacity) or capacity < 1 or capacity >= k + 1:
        return []
    return [
        Issue(
            "PWR408",
            f"runtime.verify_capacity = {capacity} cannot hold the anchor and K = {k} proposals ({k + 1} rows)",
            ("runtime", "verify_capacity"),
            hint=f"set verify_capacity to at least {k + 1}, or lower spec_draft_max to {capacity - 1}"
            if capacity > 1
            else f"set verify_capacity to at least {k + 1}",
        )
    ]


def _ngram_window(runtime: dict[str, Any], k: int) -> list[Issue]:
    """The n-gram's draft lengths: the shortest kept must not exceed the longest (default K)."""
    draft_min = _positive_int(runtime, "ngram_draft_min", ProfileRuntime, upper=1024)
    draft_max = runtime.get("ngram_draft_max", k)
    if draft_min is None or not _is_int(draft_max) or draft_max < 1 or draft_min <= draft_max:
        return []
    named = "ngram_draft_max" if "ngram_draft_max" in runtime else f"K (spec_draft_max = {k})"
    return [
        Issue(
            "PWR411",
            f"ngram_draft_min = {draft_min} > the longest n-gram draft, {named} = {draft_max}: every draft would "
            "be dropped, so the n-gram never proposes",
            ("runtime", "ngram_draft_min"),
            hint=f"lower ngram_draft_min to {draft_max} or less, or raise the longest draft",
        )
    ]


def _batches(runtime: dict[str, Any]) -> list[Issue]:
    """llama.cpp clamps the micro-batch to the batch (llama_context: n_ubatch = min(n_batch, n_ubatch))."""
    batch = _positive_int(runtime, "batch", ProfileRuntime)
    ubatch = _positive_int(runtime, "ubatch", ProfileRuntime)
    if batch is None or ubatch is None or ubatch <= batch:
        return []
    return [
        Issue(
            "PWR505",
            f"runtime.ubatch = {ubatch} > runtime.batch = {batch}: the engine runs micro-batches of {batch} "
            f"(n_ubatch = min(n_batch, n_ubatch)) and the plan is sized for that",
            ("runtime", "ubatch"),
            hint=f"set ubatch to at most {batch}, or raise batch to {ubatch}",
        )
    ]


def _tensor_split(runtime: dict[str, Any]) -> list[Issue]:
    ratios = runtime.get("tensor_split")
    if not isinstance(ratios, list) or not all(_is_number(r) for r in ratios):
        return []
    for index, ratio in enumerate(ratios):
        if ratio < 0:
            return [Issue("PWR506", f"runtime.tensor_split[{index}] = {ratio} is negative: a device's share of the "
                                    "layers is a ratio >= 0", ("runtime", "tensor_split", index),
                          hint="give each device a ratio >= 0, e.g. tensor_split = [3, 1]")]
    if ratios and not any(ratios):
        return [Issue("PWR506", "runtime.tensor_split is all zero: no device gets a layer (llama.cpp would split by "
                                "free memory at start, which the plan cannot size)", ("runtime", "tensor_split"),
                      hint="give the devices their shares, e.g. tensor_split = [3, 1], or remove the key")]
    return []


# --- helpers --------------------------------------------------------------------


def _positive_int(data: dict[str, Any], key: str, model: type[BaseModel], upper: int | None = None) -> int | None:
    """The value if present and valid, the model's default if absent, None if invalid."""
    value = data.get(key, model.model_fields[key].default)
    if not _is_int(value) or value < 1 or (upper is not None and value > upper):
        return None
    return value


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _spec_mode(value: Any) -> str | None:
    return value if value in modes.SPEC_MODES else None


def _usable_kinds() -> list[str]:
    return [m.name for m in modes.MODES if not m.reserved]


def _external_kinds() -> list[str]:
    return [m.name for m in modes.MODES if m.file_backed and not m.reserved]


def _and(items) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _draft_overrides(runtime: dict[str, Any]) -> list[Issue]:
    """PWR532: each runtime.draft_override_tensor entry is PATTERN=CPU or PATTERN=CUDA<n>, its pattern a regex."""
    entries = runtime.get("draft_override_tensor")
    if not isinstance(entries, list):
        return []
    issues = []
    for index, entry in enumerate(entries):
        if isinstance(entry, str) and override_target(entry) is None:
            issues.append(Issue("PWR532", f"runtime.draft_override_tensor[{index}] = {entry!r} is not PATTERN=CPU or "
                                "PATTERN=CUDA<n> with a regular expression llama.cpp can search tensor names with",
                                ("runtime", "draft_override_tensor", index),
                                hint='write e.g. "blk\\.1\\.ffn_.*=CPU" (host memory) or "output=CUDA1"'))
    return issues


def override_target(entry: str) -> tuple[str, int | None] | None:
    """`PATTERN=CPU` -> (pattern, None); `PATTERN=CUDA1` -> (pattern, 1); None when malformed."""
    pattern, _, buffer = entry.rpartition("=")
    match = re.fullmatch(r"CPU|CUDA(\d+)", buffer)
    if not pattern or match is None:
        return None
    try:
        re.compile(pattern)
    except re.error:
        return None
    return pattern, int(match.group(1)) if match.group(1) is not None else None
