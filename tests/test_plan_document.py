"""The plan document: canonical digest, atomic save, JSON/TOML round trip, tamper detection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from power.artifacts.bounded_reader import DocumentError
from power.documents.plan import (
    Device,
    DeviceMemory,
    Drafter,
    FileRef,
    FindingRecord,
    Memory,
    MemoryComponent,
    MemorySlots,
    Mode,
    PlanError,
    ResolvedPlan,
    Runtime,
    Sampling,
    Sources,
    Speculation,
    Target,
    Tokenizer,
    load_plan,
    save_plan,
)
from power.findings import Finding, Severity


def sample_plan(**overrides) -> ResolvedPlan:
    sections = dict(
        name="demo",
        sources=Sources(manifest=FileRef(path="/m.toml", sha256="a" * 64),
                        profile=FileRef(path="/p.toml", sha256="b" * 64)),
        devices=(Device(index=0, name="24 GiB", vram_bytes=24 << 30, headroom_bytes=512 << 20),),
        target=Target(path="/t.gguf", size=1000, sha256="c" * 64, architecture="qwen35", quant="Q6_K",
                      n_layers=4, vocab_size=512, has_mtp=True),
        mode=Mode(requested="auto", resolved="dspark", chain=("ngram", "dspark"), reason="verified external artifact"),
        drafters=(Drafter(kind="ngram"),
                  Drafter(kind="dspark", path="/d.gguf", size=10, sha256="d" * 64, target_sha256="c" * 64,
                          contract={"block_size": 16, "target_layers": (1, 3)})),
        speculation=Speculation(k=10, s=6, rollback="guarded", adaptive=True),
        runtime=Runtime(ctx=512, batch=12, verify_capacity=11, arithmetic="quantised", gpu_layers=999, flash_attn=False,
                        cuda_graphs=True,
                        kv_cache_type="f16", draft_kv_cache_type="f16", ngram_match=24, ngram_draft_min=12,
                            ngram_draft_max=48),
        sampling=Sampling(temperature=0.0, seed=0, verify="match"),
        memory=Memory(engine="llama-server", ctx=512,
                      slots=MemorySlots(slots=1, kv_unified=False, engine_ctx=512, ctx_per_slot=512, kv_streams=1,
                                        batch=12, ubatch=12, outputs=11),
                      devices=(DeviceMemory(index=0, name="24 GiB", device_bytes=24 << 30, headroom_bytes=512 << 20,
                                            holds="layers 0-3 + output layer",
                                            components=(MemoryComponent(name="target weights", bytes=1000,
                                                                        detail="Q6_K"),),
                                            total_bytes=1000, margin_bytes=(24 << 30) - (512 << 20) - 1000,
                                            verdict="fits"),),
                      total_bytes=1000, margin_bytes=(24 << 30) - (512 << 20) - 1000, verdict="fits", max_ctx=4096),
        tokenizer=Tokenizer(vocab_size=512, merges=10, model="gpt2", pre="qwen35", sha256="e" * 64),
        findings=(FindingRecord.of(Finding("PWR402", Severity.INFO, "guarded", file="/p.toml", line=3, col=1)),),
    )
    return ResolvedPlan.build(**(sections | overrides))


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_round_trip_keeps_content_and_digest(tmp_path, suffix):
    plan = sample_plan()
    path = tmp_path / f"plan{suffix}"
    save_plan(plan, path)
    loaded = load_plan(path)
    assert loaded == plan
    assert len(loaded.digest) == 64
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_document_starts_with_schema_and_digest_covers_content():
    plan = sample_plan()
    document = plan.document()
    assert next(iter(document)) == "schema" and document["schema"] == "power.plan/v1"
    assert sample_plan().digest == plan.digest
    assert sample_plan(name="other").digest != plan.digest


def test_digest_does_not_depend_on_where_the_files_lie():
    plan = sample_plan()
    moved = sample_plan(
        sources=Sources(manifest=FileRef(path="/elsewhere/m.toml", sha256="a" * 64),
                        profile=FileRef(path="/elsewhere/p.toml", sha256="b" * 64)),
        target=plan.target.model_copy(update={"path": "/elsewhere/t.gguf"}),
        findings=(FindingRecord.of(Finding("PWR402", Severity.INFO, "guarded", file="/elsewhere/p.toml", line=3,
                                           col=1)),),
    )
    assert moved.digest == plan.digest
    assert sample_plan(target=plan.target.model_copy(update={"sha256": "f" * 64})).digest != plan.digest


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_hand_edited_plan_fails_its_digest(tmp_path, suffix):
    path = tmp_path / f"plan{suffix}"
    save_plan(sample_plan(), path)
    path.write_text(path.read_text().replace("512", "1024", 1))
    with pytest.raises(PlanError, match="digest mismatch.*edited after it was compiled"):
        load_plan(path)


def test_not_a_plan_is_named(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"schema": "power.manifest/v1"}))
    with pytest.raises(PlanError, match="not a Power plan"):
        load_plan(path)
    path.write_text("{broken")
    with pytest.raises(PlanError, match="not valid JSON"):
        load_plan(path)


def test_plan_is_immutable():
    plan = sample_plan()
    with pytest.raises(ValidationError):
        plan.speculation.k = 3  # type: ignore[misc]


def test_the_engine_reads_the_plan_sections_as_they_are():
    from power.runtime.workload import Workload

    plan = sample_plan()
    workload = Workload.of_plan(plan, Path("/plans/p.json"))
    assert (workload.speculation, workload.runtime, workload.sampling, workload.mode) == (
        plan.speculation, plan.runtime, plan.sampling, plan.mode)
    assert (workload.mode.resolved, workload.mode.chain, workload.speculation.k, workload.speculation.s,
            workload.speculation.rollback) == ("dspark", ("ngram", "dspark"), 10, 6, "guarded")
    assert workload.drafter("dspark") == Path("/d.gguf") and workload.plan_digest == plan.digest
    assert (workload.runtime.verify_capacity, workload.runtime.ctx, workload.runtime.batch,
            workload.sampling.verify) == (11, 512, 12, "match")


def test_findings_keep_their_place():
    record = sample_plan().findings[0]
    assert (record.code, record.severity, record.file, record.line, record.col) == ("PWR402", "info", "/p.toml", 3, 1)


def test_a_plan_with_a_number_past_64_bits_is_never_built():
    memory = sample_plan().memory
    device = memory.devices[0].model_copy(update={
        "components": (MemoryComponent(name="target KV", bytes=2**70, detail="absurd header"),),
        "total_bytes": 2**70, "margin_bytes": -(2**70), "verdict": "does-not-fit"})
    huge = memory.model_copy(update={"devices": (device,), "total_bytes": 2**70, "margin_bytes": -(2**70),
                                     "verdict": "does-not-fit"})
    with pytest.raises(DocumentError, match=r"`memory\.\w+.*` is an integer outside the 64-bit range"):
        sample_plan(memory=huge)
