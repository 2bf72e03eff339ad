"""The plan compiler: manifest + profile + host device -> a ResolvedPlan, or the findings that refuse it.

Order, failing closed at each step: the loaded files' own findings; every
declared artifact against its file (PWR11x, PWR10x); each drafter's contract,
binding and tokenizer (PWR21x, PWR31x); mode resolution (PWR21x); settings
against the resolved mode and the artifacts (PWR42x); the devices against the
split settings (PWR507, PWR508, PWR510); what the deployment's engine cannot run, asked of its
adapter (PWR460, PWR463, PWR509-511); sizing for the deployment's engine
(PWR50x). Any error finding means no plan; warnings and info travel inside the
plan.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from power import modes
from power.artifacts import contracts
from power.artifacts.bounded_reader import MAX_TOML_BYTES, DocumentError, read_bytes
from power.artifacts.checkpoint import WEIGHTS_SUFFIX
from power.artifacts.digests import file_stamp, sha256_file
from power.artifacts.facts import RECURRENT, ArtifactError, ArtifactFacts, inspect_artifact
from power.documents.arithmetic import resolve as resolve_arithmetic
from power.documents.plan import (
    CheckpointFile,
    ContractValue,
    Device,
    DeviceMemory,
    Drafter,
    FileRef,
    FindingRecord,
    Memory,
    MemoryComponent,
    MemorySlots,
    Mode,
    ResolvedPlan,
    Runtime,
    Sampling,
    Source,
    Sources,
    Speculation,
    Target,
    Tokenizer,
    flash_attention_on,
)
from power.findings import Finding, has_errors
from power.orchestrator.engines import Asked, AskedDrafter, adapter
from power.orchestrator.engines.base import draft_placed
from power.orchestrator.engines.sizing import (
    CheckpointDraft,
    Component,
    DeviceBudget,
    MiB,
    Request,
    Sizing,
    Split,
    trunk_layers,
    whole,
)
from power.orchestrator.engines.sizing.model import default_ratios
from power.orchestrator.inputs.loading import Loaded
from power.orchestrator.inputs.rules import override_target
from power.orchestrator.inputs.schema import HostSpec, ProfileRuntime
from power.orchestrator.planning.checks.artifacts import Checked, check_artifact, file_quant
from power.orchestrator.planning.checks.checkpoints import CheckedCheckpoint, check_checkpoint
from power.orchestrator.planning.checks.devices import check_devices
from power.orchestrator.planning.checks.drafters import check_drafter, contract_facts
from power.orchestrator.planning.checks.memory import check_memory
from power.orchestrator.planning.checks.speculation import check_speculation
from power.orchestrator.planning.checks.tokenizer import check_tokenizer
from power.orchestrator.planning.resolve import Declared, Resolution, resolve


class ArtifactMemo:
    """Each artifact's header and digest read once (keyed by path and `file_stamp`), errors included."""

    def __init__(self) -> None:
        self._facts: dict[tuple, ArtifactFacts | ArtifactError] = {}
        self._digests: dict[tuple, str | ArtifactError] = {}

    def facts(self, path: Path) -> ArtifactFacts:
        return self._memo(self._facts, path, inspect_artifact)

    def sha256(self, path: Path) -> str:
        return self._memo(self._digests, path, sha256_file)

    @staticmethod
    def _memo(store: dict, path: Path, compute):
        key = (str(Path(path).resolve()), file_stamp(os.stat(path)))
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
    checkpoints: dict[int, CheckedCheckpoint] = field(default_factory=dict)  # drafters given as checkpoint folders


@dataclass(frozen=True)
class Chosen:
    """The resolution and the one file-backed drafter it runs, if any."""

    resolution: Resolution
    drafter: Checked | None


def check_artifacts(manifest: Loaded, memo: ArtifactMemo,
                    with_digest: bool = True) -> tuple[Artifacts | None, list[Finding]]:
    """Every declared artifact against its file, then each drafter's contract, binding and tokenizer."""
    model = manifest.model
    target, findings = check_artifact(manifest, "target", model.target, memo, with_digest)
    drafters: dict[int, Checked] = {}
    for index, declared in enumerate(model.drafters):
        if declared.path is not None and declared.files is None:
            checked, found = check_artifact(manifest, f"drafters[{index}]", declared, memo, with_digest)
            findings += found
            if checked is not None:
                drafters[index] = checked
    if target is None:
        return None, findings
    checkpoints: dict[int, CheckedCheckpoint] = {}
    for index, declared in enumerate(model.drafters):
        if declared.files is not None:
            checkpoint, found = check_checkpoint(manifest, index, declared, memo, target,
                                                 len(trunk_layers(target.facts)), target_vocab(target.facts))
            findings += found
            if checkpoint is not None:
                checkpoints[index] = checkpoint
            continue
        own = drafters.get(index)
        findings += check_drafter(manifest, index, declared, own, target)
        if own is not None and declared.kind in modes.HEADER_CONTRACT:
            findings += check_tokenizer(index, declared.kind, own, target)
    return Artifacts(target, drafters, checkpoints), findings


def choose(manifest: Loaded, profile: Loaded, artifacts: Artifacts) -> tuple[Chosen | None, list[Finding]]:
    drafters = manifest.model.drafters
    facts = artifacts.target.facts
    target_has_head = facts.drafter_kind in modes.NATIVE_HEADS
    sidecar = [modes.mode(d.kind).sidecar and d.path is not None for d in drafters]
    runnable = [modes.mode(d.kind).artifact != "target" or target_has_head or sidecar[i] for i,
                d in enumerate(drafters)]
    declared = Declared([d.kind for d in drafters], runnable, sidecar)
    resolution, findings = resolve(profile.model.spec_mode, declared, manifest, profile, is_recurrent(facts))
    if resolution is None:
        return None, findings
    files = [artifacts.drafters[i] for i in resolution.drafters if i in artifacts.drafters]
    return Chosen(resolution, files[0] if files else None), findings


def block_size(chosen: Chosen, artifacts: Artifacts) -> int | None:
    """The chosen block drafter's draft block: its GGUF header's, or its checkpoint's config.json's."""
    if chosen.resolution.resolved not in modes.ARCHITECTURE_OF:
        return None
    if chosen.drafter is not None:
        return contracts.drafter_hparams(chosen.drafter.facts).block_size
    checkpoint = chosen_checkpoint(chosen, artifacts)
    return checkpoint.facts.block_size if checkpoint else None


def chosen_checkpoint(chosen: Chosen, artifacts: Artifacts) -> CheckedCheckpoint | None:
    """The chosen drafter, when it is given as a checkpoint folder."""
    return next((artifacts.checkpoints[i] for i in chosen.resolution.drafters if i in artifacts.checkpoints), None)


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


@dataclass(frozen=True)
class Placed:
    """Where and on what a plan runs: the host's devices (by index) and the engine."""

    host: HostSpec
    devices: tuple[int, ...] = (0,)
    engine: str = "power"

    def budgets(self) -> tuple[DeviceBudget, ...]:
        return tuple(DeviceBudget(index, self.host.devices[index].model, self.host.devices[index].vram,
                                  self.host.headroom, self.host.devices[index].kind) for index in self.devices)


def sizing_request(profile: Loaded, chosen: Chosen, artifacts: Artifacts, placed: Placed,
                   ctx: int | None = None) -> Request:
    """The settings the engine's allocation depends on, for the resolved mode."""
    settings, target = profile.model, artifacts.target.facts
    resolved = chosen.resolution.resolved
    speculating = resolved != modes.NONE
    runtime = settings.runtime
    return Request(
        ctx=ctx or runtime.ctx, slots=runtime.slots, kv_unified=runtime.kv_unified, batch=runtime.batch,
        ubatch=runtime.ubatch, verify_rows=settings.verify_rows, arithmetic=resolve_arithmetic(runtime.arithmetic),
        snapshots=settings.spec_mtp_recurrent_snapshots if speculating else 0,
        chain=tuple(chosen.resolution.chain), draft_max=settings.spec_draft_max,
        ngram_draft_max=runtime.ngram_draft_max or settings.spec_draft_max,
        kv_cache_type=runtime.kv_cache_type, draft_kv_cache_type=draft_cache_type(runtime),
        flash_attn=flash_attention_on(runtime.flash_attn), cuda_graphs=runtime.cuda_graphs,
        gpu_layers=None if runtime.gpu_layers == "all" else runtime.gpu_layers,
        draft_gpu_layers=None if runtime.draft_gpu_layers == "all" else runtime.draft_gpu_layers,
        draft_device=runtime.draft_device,
        draft_overrides=draft_overrides(runtime),
        use_mtp=speculating and modes.mode(resolved).artifact == "target",
        fr_vocab_size=settings.spec_mtp_fr_vocab_size if _has_draft_head(resolved) else None,
        vocab=target_vocab(target), split=split_of(profile, placed),
        checkpoint_draft=checkpoint_draft(chosen, artifacts))


def checkpoint_draft(chosen: Chosen, artifacts: Artifacts) -> CheckpointDraft | None:
    """The chosen checkpoint drafter as vLLM's sizing reads it: its safetensors files' bytes and, where its
    config.json gives them, its layers and KV heads (0 where it does not: no KV is charged for it)."""
    checkpoint = chosen_checkpoint(chosen, artifacts)
    if checkpoint is None:
        return None
    facts = checkpoint.facts
    weights = sum(size for name, size, _ in checkpoint.files if name.endswith(WEIGHTS_SUFFIX))
    return CheckpointDraft(weights, facts.layers or 0, facts.kv_heads or 0, facts.head_dim or 0)


def draft_cache_type(runtime: ProfileRuntime) -> str:
    """The drafter's KV cache type: its own, else the target's."""
    return runtime.draft_kv_cache_type or runtime.kv_cache_type


def draft_overrides(runtime: ProfileRuntime) -> tuple[tuple[str, int | None], ...]:
    """The drafter tensors placed by name, as (pattern, device position or None for host memory)."""
    targets = (override_target(entry) for entry in runtime.draft_override_tensor or ())
    return tuple(target for target in targets if target is not None)


def draft_device_name(runtime: ProfileRuntime) -> str | None:
    """The drafter's device as llama-server names it: the render lists the plan's GPUs as the CUDA devices, in order,
    so the deployment's device N is `CUDA{N}`."""
    return None if runtime.draft_device is None else f"CUDA{runtime.draft_device}"


def split_of(profile: Loaded, placed: Placed) -> Split:
    """The profile's split settings; several devices without tensor_split get each device's memory after the
    headroom as ratios (written into the plan, so the engine never splits by what happens to be free)."""
    runtime = profile.model.runtime
    ratios = tuple(float(r) for r in runtime.tensor_split) if runtime.tensor_split is not None else None
    if ratios is None and len(placed.devices) > 1:
        ratios = tuple(float(r // MiB) for r in default_ratios(placed.budgets()))
    return Split(mode=runtime.split_mode, ratios=ratios, main=runtime.main_gpu, tensor_parallel=runtime.tensor_parallel)


def size_for(profile: Loaded, chosen: Chosen, artifacts: Artifacts, placed: Placed, ctx: int | None = None) -> Sizing:
    """The breakdown with the largest context that fits, and a layer split that fits when the plan's does not."""
    target = artifacts.target.facts
    request = sizing_request(profile, chosen, artifacts, placed, ctx)
    drafter = chosen.drafter.facts if chosen.drafter else None
    limit = whole(target.hparam("context_length")) or request.ctx
    return adapter(placed.engine).fitted(target, drafter, request, placed.budgets(), limit)


def asked_of(manifest: Loaded, profile: Loaded, chosen: Chosen, placed: Placed) -> Asked:
    """What the deployment asks its engine to run, with each drafter's place in the manifest."""
    runtime = profile.model.runtime
    declared = manifest.model.drafters
    drafters = tuple(AskedDrafter(declared[i].kind, i, declared[i].path is not None, declared[i].files is not None)
                     for i in chosen.resolution.drafters)
    return Asked(
        tuple(chosen.resolution.chain),
        drafters,
        runtime.kv_cache_type,
        flash_attention_on(runtime.flash_attn),
        runtime.tensor_parallel,
        len(placed.devices),
        runtime.kv_unified,
        profile.model.spec_draft_p_min,
        draft_placed=draft_placed(runtime.draft_device is not None, runtime.draft_gpu_layers, len(placed.devices))
        or bool(runtime.draft_override_tensor),
        draft_kv_cache_type=draft_cache_type(runtime),
        graphs_on_gpu=runtime.cuda_graphs and any(placed.host.devices[i].kind == "gpu" for i in placed.devices),
    )


def engine_findings(manifest: Loaded, profile: Loaded, chosen: Chosen, placed: Placed,
                    target: ArtifactFacts) -> list[Finding]:
    """What the deployment's engine cannot run (its mode, artifacts, settings, the target's shape), located at the
    manifest or profile key to change: asked before sizing, so no plan an engine cannot run is ever sealed."""
    engine = adapter(placed.engine)
    asked = asked_of(manifest, profile, chosen, placed)
    refusals = engine.supports(asked) + engine.target_refusals(target, asked)
    documents = {"manifest": manifest, "profile": profile}
    files = [target] + ([chosen.drafter.facts] if chosen.drafter else [])
    return [documents[r.document].finding(r.code, f"engine {engine.name}: {r.message}", where=r.where, hint=r.hint)
            for r in refusals] + [finding for facts in files for finding in engine.artifact_findings(facts)]


def placement_findings(manifest: Loaded, profile: Loaded, chosen: Chosen, placed: Placed,
                       target: ArtifactFacts) -> list[Finding]:
    """The devices against the split settings, then what the engine cannot run: `plan` and `size` ask both."""
    return check_devices(profile, placed.host, placed.devices) + engine_findings(manifest, profile, chosen, placed,
                                                                                 target)


def compile_plan(manifest: Loaded, profile: Loaded, host: HostSpec, devices: tuple[int, ...] = (0,),
                 artifacts: ArtifactMemo | None = None, host_path: Path | None = None,
                 engine: str = "power") -> tuple[ResolvedPlan | None, list[Finding]]:
    """The plan for `manifest` + `profile` run by `engine` on `host`'s `devices`, and every
    finding; None on any error."""
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
    findings += check_speculation(profile, chosen.resolution.resolved, block_size(chosen, checked), target_vocab_size)
    placed = Placed(host, tuple(devices), engine)
    findings += placement_findings(manifest, profile, chosen, placed, checked.target.facts)
    if has_errors(findings):
        return None, findings
    sizing = size_for(profile, chosen, checked, placed)
    findings += check_memory(profile, sizing, chosen.drafter.facts if chosen.drafter else None)
    if has_errors(findings):
        return None, findings
    host_ref = None
    if host_path is not None:
        try:
            host_ref = _host_ref(host_path)
        except DocumentError as err:
            return None, [*findings, err.finding("PWR013", host_path, "check the host file", what="the host file")]
    sources = Sources(manifest=_file_ref(manifest), profile=_file_ref(profile), host=host_ref)
    try:
        plan = build_plan(manifest, profile, placed, sources, checked, chosen, sizing, findings)
    except DocumentError as err:
        refusal = err.finding("PWR504", checked.target.facts.path, "a header value is past physical sense: check "
                              "the artifact's hyper-parameters with `power inspect`")
        return None, [*findings, dataclasses.replace(refusal, message=f"no plan: {refusal.message}")]
    return plan, findings


def build_plan(manifest: Loaded, profile: Loaded, placed: Placed, sources: Sources,
               artifacts: Artifacts, chosen: Chosen, sizing: Sizing, findings: list[Finding]) -> ResolvedPlan:
    settings, runtime, resolution = profile.model, profile.model.runtime, chosen.resolution
    target = artifacts.target
    speculating = resolution.resolved != modes.NONE
    k = settings.spec_draft_max if speculating else 0
    s = settings.spec_mtp_recurrent_snapshots if speculating else 0
    chain = resolution.chain
    weight_free = any(kind in modes.WEIGHT_FREE for kind in chain)
    split = split_of(profile, placed)
    drafters = tuple(_drafter(manifest, index, artifacts) for index in resolution.drafters)
    return ResolvedPlan.build(
        name=manifest.model.name,
        sources=sources,
        devices=tuple(Device(index=b.index, name=b.name, vram_bytes=b.memory_bytes, headroom_bytes=b.headroom_bytes,
                             kind=b.kind) for b in placed.budgets()),
        target=Target(
            path=target.facts.path, size=target.facts.size, sha256=target.sha256,
            architecture=target.facts.architecture,
            quant=file_quant(target.facts), n_layers=len(trunk_layers(target.facts)),
            vocab_size=target_vocab(target.facts), context_length=whole(target.facts.hparam("context_length")) or None,
            has_mtp=target.facts.drafter_kind in modes.NATIVE_HEADS,
            recurrent_layers=sum(1 for layer in target.facts.layers if layer.kind == RECURRENT),
            source=published(manifest.model.target)),
        mode=Mode(requested=resolution.requested, resolved=resolution.resolved, chain=chain, reason=resolution.reason),
        drafters=drafters,
        speculation=Speculation(
            k=k, s=s, rollback="none" if not speculating else ("full" if s >= k else "guarded"),
            fr_vocab_size=settings.spec_mtp_fr_vocab_size if _has_draft_head(resolution.resolved) else None,
            adaptive=settings.spec_mtp_adaptive and speculating, p_min=_p_min(settings, resolution, drafters)),
        runtime=Runtime(
            ctx=sizing.ctx, batch=runtime.batch, ubatch=runtime.ubatch, slots=runtime.slots,
            kv_unified=runtime.kv_unified,
            verify_capacity=settings.verify_rows, arithmetic=resolve_arithmetic(runtime.arithmetic),
            gpu_layers=runtime.gpu_layers,
            split_mode=split.mode, tensor_split=split.ratios, main_gpu=split.main,
            tensor_parallel=split.tensor_parallel,
            flash_attn=runtime.flash_attn, cuda_graphs=runtime.cuda_graphs, kv_cache_type=runtime.kv_cache_type,
            draft_kv_cache_type=draft_cache_type(runtime), draft_device=draft_device_name(runtime),
            draft_gpu_layers=runtime.draft_gpu_layers, draft_override_tensor=tuple(runtime.draft_override_tensor or ()),
            ngram_match=runtime.ngram_match if weight_free else None,
            ngram_draft_min=runtime.ngram_draft_min if weight_free else None,
            ngram_draft_max=(runtime.ngram_draft_max or settings.spec_draft_max) if weight_free else None),
        sampling=Sampling(temperature=settings.sampling.temperature, seed=settings.sampling.seed,
                          verify=settings.sampling.verify),
        memory=memory_section(sizing),
        tokenizer=_tokenizer(target.facts),
        findings=tuple(FindingRecord.of(f) for f in findings),
    )


def _p_min(settings, resolution: Resolution, drafters: tuple[Drafter, ...]) -> float | None:
    """The confidence gate a gated drafter runs with: the profile's, else its header's threshold (never an engine's)."""
    if resolution.resolved not in modes.CONFIDENCE_GATED:
        return None
    if settings.spec_draft_p_min is not None:
        return settings.spec_draft_p_min
    gated = next(d for d in drafters if d.kind == resolution.resolved)
    threshold = gated.contract.get("confidence_threshold")
    return float(threshold) if isinstance(threshold, (int, float)) else None


def _has_draft_head(resolved: str) -> bool:
    """Whether the resolved mode projects through a draft head whose vocabulary FR may cut."""
    return resolved != modes.NONE and modes.mode(resolved).fr


def memory_section(sizing: Sizing) -> Memory:
    slots = sizing.slots
    return Memory(
        engine=sizing.engine, ctx=sizing.ctx,
        slots=MemorySlots(slots=slots.slots, kv_unified=slots.kv_unified, engine_ctx=slots.engine_ctx,
                          ctx_per_slot=slots.ctx_per_slot, kv_streams=slots.kv_streams,
                          sliding_cells=slots.sliding_cells, batch=slots.batch, ubatch=slots.ubatch,
                          outputs=slots.outputs),
        devices=tuple(DeviceMemory(index=d.device.index, name=d.device.name, device_bytes=d.device.memory_bytes,
                                   headroom_bytes=d.device.headroom_bytes, holds=d.holds,
                                   components=_components(d.components), total_bytes=d.total_bytes,
                                   margin_bytes=d.margin_bytes, verdict=d.verdict) for d in sizing.devices),
        host=_components(sizing.host), total_bytes=sizing.total_bytes, margin_bytes=sizing.margin_bytes,
        verdict=sizing.verdict, max_ctx=sizing.max_ctx)


def _components(components: tuple[Component, ...]) -> tuple[MemoryComponent, ...]:
    return tuple(MemoryComponent(name=c.name, bytes=c.bytes, detail=c.detail, basis=c.basis) for c in components)


def _drafter(manifest: Loaded, index: int, artifacts: Artifacts) -> Drafter:
    declared = manifest.model.drafters[index]
    if index in artifacts.checkpoints:
        return _checkpoint_drafter(declared, artifacts.checkpoints[index])
    own = artifacts.drafters.get(index)
    return Drafter(
        kind=declared.kind,
        path=own.facts.path if own else None,
        size=own.facts.size if own else None,
        sha256=own.sha256 if own else None,
        target_sha256=declared.target_sha256,
        contract=contract_facts(declared.kind, own, artifacts.target),
        source=published(declared),
    )


def _checkpoint_drafter(declared, checkpoint: CheckedCheckpoint) -> Drafter:
    """A checkpoint drafter as the plan seals it: its folder, its files' total size, one digest over its files'
    digests (`listing_sha256`) and each file's own; config.json's facts as its contract."""
    facts = checkpoint.facts
    contract: dict[str, ContractValue] = {"format": "checkpoint", "architecture": facts.architecture}
    contract |= {key: value for key, value in (
        ("block_size", facts.block_size), ("target_layers", facts.target_layers),
        ("target_hidden_size", facts.target_hidden_size), ("draft_vocab_size", facts.draft_vocab_size),
        ("target_layer_ids", facts.aux_layer_ids)) if value is not None}
    return Drafter(kind=declared.kind, path=str(facts.folder), size=checkpoint.size, sha256=checkpoint.sha256,
                   target_sha256=declared.target_sha256, contract=contract, source=published(declared),
                   files=tuple(CheckpointFile(name=name, size=size, sha256=digest)
                               for name, size, digest in checkpoint.files))


def published(declared) -> Source | None:
    """The manifest entry's `source` as the plan seals it: a Hub file named in full (its file name defaults to the
    artifact's), or the URL."""
    source = declared.source
    if source is None:
        return None
    if source.url is not None:
        return Source(url=source.url)
    if getattr(declared, "files", None) is not None:  # a checkpoint: the repository's files, each named in `files`
        return Source(repo=source.repo, revision=source.revision)
    return Source(repo=source.repo, revision=source.revision, filename=source.filename or Path(declared.path).name)


def _tokenizer(facts: ArtifactFacts) -> Tokenizer | None:
    tok = facts.tokenizer
    if tok is None:
        return None
    return Tokenizer(vocab_size=tok.vocab_size, merges=tok.merges_count, model=tok.model or "unknown", pre=tok.pre,
                     sha256=tok.fingerprint)


def _file_ref(loaded: Loaded) -> FileRef:
    """The file as it was loaded: the digest of the bytes that were validated and compiled."""
    return FileRef(path=str(loaded.path.resolve()), sha256=loaded.sha256)


def _host_ref(path: Path) -> FileRef:
    resolved = Path(path).resolve()
    return FileRef(path=str(resolved), sha256=hashlib.sha256(read_bytes(resolved, MAX_TOML_BYTES)).hexdigest())
