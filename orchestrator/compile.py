"""The plan compiler: manifest + profile + host device -> a ResolvedPlan, or the findings that refuse it.

Order, failing closed at each step: the loaded files' own findings; every
declared artifact against its file (PWR11x, PWR10x); each drafter's contract,
binding and tokenizer (PWR21x, PWR31x); mode resolution (PWR21x); settings
against the resolved mode and the artifacts (PWR42x); sizing (PWR50x). Any error
finding means no plan; warnings and info travel inside the plan.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from power import modes
from power.artifacts import contracts
from power.artifacts.digests import sha256_file
from power.artifacts.facts import RECURRENT, ArtifactError, ArtifactFacts, inspect_artifact
from power.findings import Finding, has_errors
from power.orchestrator.checks.artifacts import Checked, check_artifact, file_quant
from power.orchestrator.checks.drafters import check_drafter, contract_facts
from power.orchestrator.checks.memory import check_memory
from power.orchestrator.checks.speculation import check_speculation
from power.orchestrator.checks.tokenizer import check_tokenizer
from power.orchestrator.loading import Loaded
from power.orchestrator.plan import (
    Device,
    Drafter,
    FileRef,
    FindingRecord,
    Memory,
    MemoryComponent,
    Mode,
    ResolvedPlan,
    Runtime,
    Sampling,
    Sources,
    Speculation,
    Target,
    Tokenizer,
)
from power.orchestrator.resolve import Resolution, resolve
from power.orchestrator.schema import HostSpec
from power.orchestrator.sizing import Budget, Request, Sizing, largest_context, size_plan, trunk_layers, whole


class ArtifactMemo:
    """Each artifact's header and digest read once (keyed by path, size and mtime), errors included."""

    def __init__(self) -> None:
        self._facts: dict[tuple, ArtifactFacts | ArtifactError] = {}
        self._digests: dict[tuple, str | ArtifactError] = {}

    def facts(self, path: Path) -> ArtifactFacts:
        return self._memo(self._facts, path, inspect_artifact)

    def sha256(self, path: Path) -> str:
        return self._memo(self._digests, path, sha256_file)

    @staticmethod
    def _memo(store: dict, path: Path, compute):
        info = os.stat(path)
        key = (str(Path(path).resolve()), info.st_size, info.st_mtime_ns)
        if key not in store:
            try:
                store[key] = compute(path)
            except ArtifactError as err:
                store[key] = err
        value = store[key]
        if isinstance(value, ArtifactError):
            raise value
        return value


@dataclass(frozen=True)
class Artifacts:
    target: Checked
    drafters: dict[int, Checked]  # manifest drafter index -> its own file (file-backed kinds only)


@dataclass(frozen=True)
class Chosen:
    """The resolution and the one file-backed drafter it runs, if any."""

    resolution: Resolution
    drafter: Checked | None


def check_artifacts(manifest: Loaded, memo: ArtifactMemo, with_digest: bool = True) -> tuple[Artifacts | None, list[Finding]]:
    """Every declared artifact against its file, then each drafter's contract, binding and tokenizer."""
    model = manifest.model
    target, findings = check_artifact(manifest, "target", model.target, memo, with_digest)
    drafters: dict[int, Checked] = {}
    for index, declared in enumerate(model.drafters):
        if declared.path is not None:
            checked, found = check_artifact(manifest, f"drafters[{index}]", declared, memo, with_digest)
            findings += found
            if checked is not None:
                drafters[index] = checked
    if target is None:
        return None, findings
    for index, declared in enumerate(model.drafters):
        own = drafters.get(index)
        findings += check_drafter(manifest, index, declared, own, target)
        if own is not None and declared.kind in contracts.FILE_KINDS:
            findings += check_tokenizer(index, declared.kind, own, target)
    return Artifacts(target, drafters), findings


def choose(manifest: Loaded, profile: Loaded, artifacts: Artifacts) -> tuple[Chosen | None, list[Finding]]:
    declared = [d.kind for d in manifest.model.drafters]
    facts = artifacts.target.facts
    resolution, findings = resolve(profile.model.spec_mode, declared, facts.drafter_kind == contracts.MTP,
                                   manifest, profile, is_recurrent(facts))
    if resolution is None:
        return None, findings
    files = [artifacts.drafters[i] for i in resolution.drafters if i in artifacts.drafters]
    return Chosen(resolution, files[0] if files else None), findings


def is_recurrent(facts: ArtifactFacts) -> bool:
    return any(layer.kind == RECURRENT for layer in facts.layers)


def target_vocab(facts: ArtifactFacts) -> int:
    """The target's vocabulary: its tokenizer, else `{arch}.vocab_size`, else the output projection's rows."""
    if facts.tokenizer is not None:
        return facts.tokenizer.vocab_size
    if whole(facts.hparam("vocab_size")):
        return whole(facts.hparam("vocab_size"))
    shapes = facts.tensor_shapes
    head = shapes.get("output.weight") or shapes.get("token_embd.weight")
    return head[0] if head else 0


def size_for(profile: Loaded, chosen: Chosen, artifacts: Artifacts, budget: Budget, ctx: int | None = None) -> Sizing:
    """The memory breakdown for the resolved mode, with the largest context that fits."""
    settings, target = profile.model, artifacts.target.facts
    resolved = chosen.resolution.resolved
    speculating = resolved != modes.NONE
    runtime = settings.runtime
    request = Request(
        ctx=ctx or runtime.ctx,
        verify_rows=settings.verify_rows,
        snapshots=settings.spec_mtp_recurrent_snapshots if speculating else 0,
        kv_cache_type=runtime.kv_cache_type,
        flash_attn=runtime.flash_attn,
        cuda_graphs=runtime.cuda_graphs,
        gpu_layers=None if runtime.gpu_layers == "all" else runtime.gpu_layers,
        use_mtp=speculating and modes.mode(resolved).artifact == "target",
        fr_vocab_size=settings.spec_mtp_fr_vocab_size if _has_draft_head(resolved) else None,
        vocab=target_vocab(target),
    )
    drafter = chosen.drafter.facts if chosen.drafter else None
    sizing = size_plan(target, drafter, request, budget)
    limit = whole(target.hparam("context_length")) or request.ctx
    return Sizing(sizing.ctx, sizing.components, budget, largest_context(target, drafter, request, budget, limit))


def budget_of(host: HostSpec, device: int) -> tuple[Budget, str]:
    spec = host.devices[device]
    return Budget(spec.vram, host.headroom), spec.model


def compile_plan(manifest: Loaded, profile: Loaded, host: HostSpec, device: int = 0,
                 artifacts: ArtifactMemo | None = None, host_path: Path | None = None) -> tuple[ResolvedPlan | None, list[Finding]]:
    """The plan for `manifest` + `profile` on `host`'s device `device`, and every finding; None on any error."""
    findings = [*manifest.findings, *profile.findings]
    if not (manifest.ok and profile.ok):
        return None, findings
    memo = artifacts or ArtifactMemo()
    checked, found = check_artifacts(manifest, memo)
    findings += found
    if checked is None or has_errors(findings):
        return None, findings
    chosen, found = choose(manifest, profile, checked)
    findings += found
    if chosen is None or has_errors(findings):
        return None, findings
    target_vocab_size = target_vocab(checked.target.facts)
    findings += check_speculation(profile, chosen.resolution.resolved, chosen.drafter, target_vocab_size)
    budget, device_name = budget_of(host, device)
    sizing = size_for(profile, chosen, checked, budget)
    findings += check_memory(profile, sizing, device_name, chosen.drafter.facts if chosen.drafter else None)
    if has_errors(findings):
        return None, findings
    plan = build_plan(manifest, profile, host, device, host_path, checked, chosen, sizing, findings)
    return plan, findings


def build_plan(manifest: Loaded, profile: Loaded, host: HostSpec, device: int, host_path: Path | None,
               artifacts: Artifacts, chosen: Chosen, sizing: Sizing, findings: list[Finding]) -> ResolvedPlan:
    settings, runtime, resolution = profile.model, profile.model.runtime, chosen.resolution
    target = artifacts.target
    speculating = resolution.resolved != modes.NONE
    k = settings.spec_draft_max if speculating else 0
    s = settings.spec_mtp_recurrent_snapshots if speculating else 0
    chain = resolution.chain
    weight_free = any(kind in modes.WEIGHT_FREE for kind in chain)
    return ResolvedPlan.build(
        name=manifest.model.name,
        sources=Sources(manifest=_file_ref(manifest.path), profile=_file_ref(profile.path),
                        host=_file_ref(host_path) if host_path else None),
        device=Device(name=host.devices[device].model, vram_bytes=sizing.budget.device_bytes,
                      headroom_bytes=sizing.budget.headroom_bytes),
        target=Target(
            path=target.facts.path, size=target.facts.size, sha256=target.sha256, architecture=target.facts.architecture,
            quant=file_quant(target.facts), n_layers=len(trunk_layers(target.facts)),
            vocab_size=target_vocab(target.facts), context_length=whole(target.facts.hparam("context_length")) or None,
            has_mtp=target.facts.drafter_kind == contracts.MTP,
            recurrent_layers=sum(1 for layer in target.facts.layers if layer.kind == RECURRENT)),
        mode=Mode(requested=resolution.requested, resolved=resolution.resolved, chain=chain, reason=resolution.reason),
        drafters=tuple(_drafter(manifest, index, artifacts) for index in resolution.drafters),
        speculation=Speculation(
            k=k, s=s, rollback="none" if not speculating else ("full" if s >= k else "guarded"),
            fr_vocab_size=settings.spec_mtp_fr_vocab_size if _has_draft_head(resolution.resolved) else None,
            adaptive=settings.spec_mtp_adaptive and speculating),
        runtime=Runtime(
            ctx=sizing.ctx, batch=runtime.batch, ubatch=runtime.ubatch, slots=runtime.slots,
            kv_unified=runtime.kv_unified,
            verify_capacity=settings.verify_rows, gpu_layers=runtime.gpu_layers,
            flash_attn=runtime.flash_attn, cuda_graphs=runtime.cuda_graphs, kv_cache_type=runtime.kv_cache_type,
            draft_kv_cache_type=runtime.kv_cache_type,
            ngram_n_min=runtime.ngram_n_min if weight_free else None,
            ngram_n_max=runtime.ngram_n_max if weight_free else None),
        sampling=Sampling(temperature=settings.sampling.temperature, seed=settings.sampling.seed,
                          verify=settings.sampling.verify),
        memory=memory_section(sizing),
        tokenizer=_tokenizer(target.facts),
        findings=tuple(FindingRecord.of(f) for f in findings),
    )


def _has_draft_head(resolved: str) -> bool:
    """Whether the resolved mode projects through a draft head whose vocabulary FR may cut."""
    return resolved != modes.NONE and modes.mode(resolved).fr


def memory_section(sizing: Sizing) -> Memory:
    return Memory(
        device_bytes=sizing.budget.device_bytes, headroom_bytes=sizing.budget.headroom_bytes, ctx=sizing.ctx,
        components=tuple(MemoryComponent(name=c.name, bytes=c.bytes, detail=c.detail) for c in sizing.components),
        total_bytes=sizing.total_bytes, margin_bytes=sizing.margin_bytes, verdict=sizing.verdict, max_ctx=sizing.max_ctx)


def _drafter(manifest: Loaded, index: int, artifacts: Artifacts) -> Drafter:
    declared = manifest.model.drafters[index]
    own = artifacts.drafters.get(index)
    return Drafter(
        kind=declared.kind,
        path=own.facts.path if own else None,
        size=own.facts.size if own else None,
        sha256=own.sha256 if own else None,
        target_sha256=declared.target_sha256,
        contract=contract_facts(declared.kind, own, artifacts.target),
    )


def _tokenizer(facts: ArtifactFacts) -> Tokenizer | None:
    tok = facts.tokenizer
    if tok is None:
        return None
    return Tokenizer(vocab_size=tok.vocab_size, merges=tok.merges_count, model=tok.model or "unknown", pre=tok.pre,
                     sha256=tok.fingerprint)


def _file_ref(path: Path) -> FileRef:
    resolved = Path(path).resolve()
    return FileRef(path=str(resolved), sha256=hashlib.sha256(resolved.read_bytes()).hexdigest())
