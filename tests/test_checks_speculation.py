"""PWR4xx through the compiler: K vs S recorded in the plan, FR and adaptive against the resolved mode, K vs block."""

from __future__ import annotations

from plan_helpers import codes, compiled, write_manifest, write_profile


def mtp_manifest(tmp_path):
    return write_manifest(tmp_path, "hybrid-target", [{"kind": "mtp"}])


def test_s_below_k_is_the_guarded_path_and_the_plan_records_it(tmp_path):
    plan, findings = compiled(mtp_manifest(tmp_path), write_profile(tmp_path, "mtp", k=7, s=6))
    assert plan is not None
    assert (plan.speculation.k, plan.speculation.s, plan.speculation.rollback) == (7, 6, "guarded")
    assert "PWR406" in [f.code for f in plan.findings]


def test_s_at_least_k_is_full_rollback(tmp_path):
    plan, _ = compiled(mtp_manifest(tmp_path), write_profile(tmp_path, "mtp", k=7, s=7))
    assert plan.speculation.rollback == "full"


def test_s_above_k_warns_that_resident_state_is_never_used(tmp_path):
    plan, findings = compiled(mtp_manifest(tmp_path), write_profile(tmp_path, "mtp", k=3, s=7))
    assert plan is not None and plan.speculation.rollback == "full"
    (warning,) = [f for f in plan.findings if f.code == "PWR407"]
    assert warning.severity == "warning"


def test_recurrent_rollback_is_sized_as_replay_inputs_not_a_state_per_snapshot(tmp_path):
    """Power's runtime rewinds a hybrid by replaying its last forward's rows from the state it started at: S > 0 adds
    the replay inputs (the same whatever S), not S states."""
    def state(profile):
        plan, _ = compiled(mtp_manifest(tmp_path), profile)
        return {c.name: c.bytes for c in plan.memory.components}["recurrent state"]

    plain = state(write_profile(tmp_path, "none", name="none"))
    small = state(write_profile(tmp_path, "mtp", k=3, s=3))
    assert plain < small == state(write_profile(tmp_path, "mtp", k=3, s=7, name="s7"))


def test_fr_larger_than_the_vocabulary(tmp_path):
    plan, findings = compiled(mtp_manifest(tmp_path), write_profile(tmp_path, "mtp", spec_mtp_fr_vocab_size=100_000))
    assert plan is None and [f.code for f in findings if f.is_error] == ["PWR422"]


def test_fr_applies_to_the_mtp_draft_head(tmp_path):
    plan, findings = compiled(mtp_manifest(tmp_path), write_profile(tmp_path, "mtp", spec_mtp_fr_vocab_size=256))
    assert plan is not None and plan.speculation.fr_vocab_size == 256
    assert "FR projection" in [c.name for c in plan.memory.components]
    full, _ = compiled(mtp_manifest(tmp_path), write_profile(tmp_path, "mtp", name="full"))
    head = {c.name: c for c in plan.memory.host}["MTP head compute + logits"]  # the head runs on the CPU
    assert head.bytes < {c.name: c.bytes for c in full.memory.host}["MTP head compute + logits"]
    assert "vocab 256 " in head.detail


def test_fr_with_a_block_drafter_cuts_its_draft_head(tmp_path):
    manifest = write_manifest(tmp_path, "dense-target", [{"kind": "dflash", "fixture": "dflash-drafter"}])
    plan, findings = compiled(manifest, write_profile(tmp_path, "dflash", spec_mtp_fr_vocab_size=256))
    assert plan is not None and plan.speculation.fr_vocab_size == 256, findings


def test_fr_without_a_draft_head_when_auto_resolves_to_ngram(tmp_path):
    manifest = write_manifest(tmp_path, "dense-target", [{"kind": "ngram"}])
    plan, findings = compiled(manifest, write_profile(tmp_path, "auto", spec_mtp_fr_vocab_size=256))
    assert plan is None and [f.code for f in findings if f.is_error] == ["PWR423"]


def test_auto_never_meets_dflash2s_fixed_shape_with_the_adaptive_controller(tmp_path):
    manifest = write_manifest(tmp_path, "hybrid-target", [{"kind": "dflash2", "fixture": "dflash2-drafter"}])
    plan, findings = compiled(manifest, write_profile(tmp_path, "auto", spec_mtp_adaptive=True))
    assert plan is not None and plan.mode.resolved == "none" and not plan.speculation.adaptive
    assert "PWR217" in codes(findings)


def test_adaptive_with_explicit_dflash2_is_the_loaders_rule(tmp_path):
    manifest = write_manifest(tmp_path, "hybrid-target", [{"kind": "dflash2", "fixture": "dflash2-drafter"}])
    plan, findings = compiled(manifest, write_profile(tmp_path, "dflash2", spec_mtp_adaptive=True))
    assert plan is None and "PWR405" in codes(findings)


def test_k_beyond_the_drafters_block(tmp_path):
    manifest = write_manifest(tmp_path, "hybrid-target", [{"kind": "dflash", "fixture": "dflash-drafter"}])
    plan, findings = compiled(manifest, write_profile(tmp_path, "dflash", k=4, s=4))
    [error] = [f for f in findings if f.is_error]
    assert plan is None and error.code == "PWR425"
    assert "block_size 4" in error.message and "at most 3" in error.message


def test_the_confidence_gate_comes_from_the_profile_else_the_drafters_header(tmp_path):
    from power.orchestrator.render import engine_launch

    manifest = write_manifest(tmp_path, "hybrid-target", [{"kind": "dspark", "fixture": "dspark-drafter"}])
    plan, findings = compiled(manifest, write_profile(tmp_path, "dspark"))
    assert plan is not None, [f.render() for f in findings]
    assert plan.speculation.p_min == 0.5  # the fixture header's dspark.confidence_threshold
    gated, _ = compiled(manifest, write_profile(tmp_path, "dspark", spec_draft_p_min=0.25), engine="llama-server")
    assert gated.speculation.p_min == 0.25
    argv = engine_launch(gated, "llama-server", tmp_path / "plan.json").argv
    assert argv[argv.index("--spec-draft-p-min") + 1] == "0.25"


def test_a_confidence_gate_for_a_mode_without_one_is_refused(tmp_path):
    manifest = write_manifest(tmp_path, "dense-target", [{"kind": "ngram"}])
    plan, findings = compiled(manifest, write_profile(tmp_path, "ngram", spec_draft_p_min=0.5))
    assert plan is None and [f.code for f in findings if f.is_error] == ["PWR426"]


def test_an_mtp_head_takes_the_confidence_gate_and_vllm_which_has_none_refuses_it(tmp_path):
    """llama.cpp's draft-mtp stops drafting at the first draft below --spec-draft-p-min, and so does Power's head;
    vLLM's MTP drafts every position, so a gated plan is never sealed for it."""
    from power.orchestrator.render import engine_launch

    profile = write_profile(tmp_path, "mtp", spec_draft_p_min=0.5)
    plan, findings = compiled(mtp_manifest(tmp_path), profile)
    assert plan is not None and plan.speculation.p_min == 0.5, [f.render() for f in findings]
    assert compiled(mtp_manifest(tmp_path), write_profile(tmp_path, "mtp", name="ungated"))[0].speculation.p_min is None
    served, _ = compiled(mtp_manifest(tmp_path), profile, engine="llama-server")
    argv = engine_launch(served, "llama-server", tmp_path / "plan.json").argv
    assert argv[argv.index("--spec-type") + 1] == "draft-mtp" and argv[argv.index("--spec-draft-p-min") + 1] == "0.5"
    refused, findings = compiled(mtp_manifest(tmp_path), profile, engine="vllm")
    [finding] = [f for f in findings if f.is_error]
    assert refused is None and finding.code == "PWR460" and finding.where == "spec_draft_p_min"
    assert finding.file == str(profile) and "no draft confidence gate" in finding.message


def test_an_ngram_plans_longest_draft_is_at_most_k(tmp_path):
    manifest = write_manifest(tmp_path, "dense-target", [{"kind": "ngram"}])
    plan, findings = compiled(manifest, write_profile(tmp_path, "ngram", k=3, runtime={"ngram_draft_max": 8}))
    assert plan is None and [f.code for f in findings if f.is_error] == ["PWR427"]
    plan, _ = compiled(manifest, write_profile(tmp_path, "ngram", k=8, s=8, runtime={"ngram_draft_max": 8}))
    assert plan is not None and plan.runtime.ngram_draft_max == 8
