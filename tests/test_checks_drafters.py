"""PWR21x: drafter kind vs header, contracts, binding, reserved draft-model, mode resolution (fail closed)."""

from __future__ import annotations

import pytest
from plan_helpers import codes, compiled, digest, fixture, write_manifest, write_profile


def errors(findings):
    return [f.code for f in findings if f.is_error]


def test_dspark_file_declared_dflash_is_rejected(tmp_path):
    manifest = write_manifest(tmp_path, "hybrid-target", [{"kind": "dflash", "fixture": "dflash-named-dspark"}])
    plan, findings = compiled(manifest, write_profile(tmp_path, "dflash"))
    assert plan is None and errors(findings) == ["PWR210"]
    (finding,) = [f for f in findings if f.code == "PWR210"]
    assert "dspark" in finding.message and str(fixture("dflash-named-dspark")) in finding.message
    # The declaration is what to fix: the finding points at the manifest's `kind` line.
    assert finding.file == str(manifest) and finding.where == "drafters[0].kind" and finding.line == 7


@pytest.mark.parametrize("declared, file", [("dflash", "dflash2-drafter"), ("dflash2", "dflash-drafter")])
def test_dflash_v1_and_dflash2_never_stand_in_for_each_other(tmp_path, declared, file):
    manifest = write_manifest(tmp_path, "hybrid-target", [{"kind": declared, "fixture": file}])
    plan, findings = compiled(manifest, write_profile(tmp_path, declared))
    assert plan is None and errors(findings) == ["PWR210"]


def test_dflash2_contract_tensors_present_plans_and_records_the_contract(tmp_path):
    manifest = write_manifest(tmp_path, "hybrid-target", [{"kind": "dflash2", "fixture": "dflash2-drafter"}])
    plan, findings = compiled(manifest, write_profile(tmp_path, "dflash2"))
    assert plan is not None, [f.render() for f in findings]
    (drafter,) = plan.drafters
    assert drafter.kind == "dflash2" and drafter.sha256 == digest(fixture("dflash2-drafter"))
    assert drafter.contract["block_size"] == 4 and drafter.contract["target_layers"] == (1, 3)
    assert drafter.contract["sliding_window"] == 32 and "conv_kernel_size" in drafter.contract


def test_mtp_on_a_target_without_nextn_tensors(tmp_path):
    manifest = write_manifest(tmp_path, "dense-target", [{"kind": "mtp"}])
    plan, findings = compiled(manifest, write_profile(tmp_path, "mtp"))
    assert plan is None and errors(findings) == ["PWR212"]
    assert findings[-1].file == str(manifest) and str(fixture("dense-target")) in findings[-1].message


def test_drafter_bound_to_another_targets_digest(tmp_path):
    manifest = write_manifest(tmp_path, "hybrid-target",
                              [{"kind": "dflash", "fixture": "dflash-drafter", "target_sha256": "ab" * 32}])
    plan, findings = compiled(manifest, write_profile(tmp_path, "dflash"))
    assert plan is None and errors(findings) == ["PWR213"]
    (finding,) = [f for f in findings if f.code == "PWR213"]
    assert finding.where == "drafters[0].target_sha256" and finding.line is not None


def test_draft_model_is_reserved_and_fails_closed(tmp_path):
    manifest = write_manifest(tmp_path, "hybrid-target", [{"kind": "mtp"}])
    plan, findings = compiled(manifest, write_profile(tmp_path, "draft-model"))
    assert plan is None and "PWR214" in errors(findings)


def test_two_context_backed_drafters_never_load_together(tmp_path):
    manifest = write_manifest(tmp_path, "hybrid-target", [{"kind": "dflash", "fixture": "dflash-drafter"},
                                                          {"kind": "dflash", "fixture": "dflash-drafter"}])
    plan, findings = compiled(manifest, write_profile(tmp_path, "auto"))
    assert plan is None and errors(findings) == ["PWR215"]
    plan, findings = compiled(manifest, write_profile(tmp_path, "dflash"))
    assert plan is None and errors(findings) == ["PWR215"]
    # Naming one of two different kinds resolves it, and only that one is in the plan.
    manifest = write_manifest(tmp_path, "hybrid-target", [{"kind": "dflash", "fixture": "dflash-drafter"},
                                                          {"kind": "dspark", "fixture": "dspark-drafter"}])
    plan, findings = compiled(manifest, write_profile(tmp_path, "dspark"))
    assert plan is not None and [d.kind for d in plan.drafters] == ["dspark"]


def test_ngram_chains_in_front_of_one_drafter(tmp_path):
    manifest = write_manifest(tmp_path, "dense-target", [{"kind": "dflash", "fixture": "dflash-drafter"},
                                                         {"kind": "ngram"}])
    plan, findings = compiled(manifest, write_profile(tmp_path, "dflash", k=3, runtime={"ngram_match": 2}))
    assert plan is not None and "PWR218" in codes(findings), [f.render() for f in findings]
    assert plan.mode.chain == ("ngram", "dflash") and [d.kind for d in plan.drafters] == ["ngram", "dflash"]
    # the chain's n-gram drafts up to K unless the profile says otherwise
    assert (plan.runtime.ngram_match, plan.runtime.ngram_draft_min, plan.runtime.ngram_draft_max) == (2, 1, 3)


def test_auto_never_chains_ngram_in_front_of_a_drafter_on_a_recurrent_target(tmp_path):
    manifest = write_manifest(tmp_path, "hybrid-target", [{"kind": "mtp"}, {"kind": "ngram"}])
    plan, findings = compiled(manifest, write_profile(tmp_path, "auto"))
    assert plan is not None and plan.mode.chain == ("mtp",) and "not chained" in plan.mode.reason
    (how,) = [f for f in findings if f.code == "PWR217"]
    assert how.severity.value == "info" and "resolved to mtp" in how.message and "losing on all traffic" in how.message
    # named explicitly, the chain is built, with the reference measurement as a warning
    plan, findings = compiled(manifest, write_profile(tmp_path, "mtp"))
    assert plan is not None and plan.mode.chain == ("ngram", "mtp")
    (chained,) = [f for f in findings if f.code == "PWR218"]
    assert chained.severity.value == "warning" and "disables recurrent rollback" in chained.message


@pytest.mark.parametrize("kind, why", [("dflash2", "7/12 complete outputs"), ("dspark", "54/100")])
def test_auto_passes_over_opt_in_drafters_and_says_why(tmp_path, kind, why):
    manifest = write_manifest(tmp_path, "hybrid-target", [{"kind": kind, "fixture": f"{kind}-drafter"}])
    plan, findings = compiled(manifest, write_profile(tmp_path, "auto"))
    assert plan is not None and plan.mode.resolved == "none"
    (how,) = [f for f in findings if f.code == "PWR217"]
    assert f"passed over {kind}" in how.message and why in how.message and f'spec_mode = "{kind}"' in how.hint
    plan, _ = compiled(manifest, write_profile(tmp_path, kind))
    assert plan is not None and plan.mode.resolved == kind


@pytest.mark.parametrize("mode", ["dspark", "dflash2", "ngram"])
def test_an_explicit_mode_the_manifest_cannot_serve_is_an_error_not_a_downgrade(tmp_path, mode):
    manifest = write_manifest(
        tmp_path, "hybrid-target", [{"kind": "mtp"}, {"kind": "dflash", "fixture": "dflash-drafter"}]
    )
    plan, findings = compiled(manifest, write_profile(tmp_path, mode))
    assert plan is None and errors(findings) == ["PWR216"]
    (finding,) = findings[-1:]
    assert finding.file.endswith(".profile.toml") and finding.line == 3


@pytest.mark.parametrize("drafters, resolved, reason", [
    ([{"kind": "mtp"}, {"kind": "dflash", "fixture": "dflash-drafter"}], "dflash", "verified external"),
    ([{"kind": "mtp"}, {"kind": "dspark", "fixture": "dspark-drafter"}], "mtp", "native MTP"),
    ([{"kind": "mtp"}, {"kind": "ngram"}], "mtp", "native MTP"),
    ([{"kind": "ngram"}], "ngram", "n-gram"),
    ([], "none", "speculation off"),
])
def test_auto_prefers_external_then_native_mtp_then_none(tmp_path, drafters, resolved, reason):
    manifest = write_manifest(tmp_path, "hybrid-target", drafters)
    plan, findings = compiled(manifest, write_profile(tmp_path, "auto"))
    assert plan is not None, [f.render() for f in findings]
    assert plan.mode.requested == "auto" and plan.mode.resolved == resolved and reason in plan.mode.reason


def test_an_mtp_sidecar_serves_a_target_shipped_without_its_head(tmp_path):
    """The reference `--spec-draft-model MTP-only.gguf --spec-type draft-mtp`: bound, checked,
    planned, sized, rendered."""
    from power.orchestrator.launch.render import engine_launch

    headless = write_manifest(tmp_path, "headless-hybrid-target", [{"kind": "mtp"}])
    plan, findings = compiled(headless, write_profile(tmp_path, "mtp"))
    assert plan is None and errors(findings) == ["PWR212"]
    manifest = write_manifest(tmp_path, "headless-hybrid-target", [{"kind": "mtp", "fixture": "mtp-sidecar"}])
    for mode in ("mtp", "auto"):
        plan, findings = compiled(manifest, write_profile(tmp_path, mode))
        assert plan is not None, [f.render() for f in findings]
        (drafter,) = plan.drafters
        assert (drafter.kind, drafter.path, drafter.sha256) == ("mtp", str(fixture("mtp-sidecar")),
                                                                digest(fixture("mtp-sidecar")))
        assert drafter.target_sha256 == plan.target.sha256 and drafter.contract == {"nextn_predict_layers": 1}
    assert "sidecar" in plan.mode.reason
    weights = {c.name: c.bytes for c in plan.memory.host}  # the drafters run on the CPU: host memory beside a GPU
    assert weights["drafter weights"] > 0
    plan, _ = compiled(manifest, write_profile(tmp_path, "auto"), engine="llama-server")
    assert plan is not None
    argv = engine_launch(plan, "llama-server", tmp_path / "plan.json").argv
    assert argv[argv.index("--spec-type") + 1] == "draft-mtp"
    assert argv[argv.index("--spec-draft-model") + 1] == str(fixture("mtp-sidecar"))


def test_an_mtp_sidecar_for_another_model_or_target_is_refused(tmp_path):
    bound_elsewhere = write_manifest(tmp_path, "headless-hybrid-target",
                                     [{"kind": "mtp", "fixture": "mtp-sidecar", "target_sha256": "ab" * 32}])
    plan, findings = compiled(bound_elsewhere, write_profile(tmp_path, "mtp"))
    assert plan is None and errors(findings) == ["PWR213"]
    other_model = write_manifest(tmp_path, "dense-target", [{"kind": "mtp", "fixture": "mtp-sidecar"}])
    plan, findings = compiled(other_model, write_profile(tmp_path, "mtp"))
    assert plan is None and set(errors(findings)) == {"PWR211"}
    assert any("general.architecture is qwen35, the target's qwen3" in f.message for f in findings)


def test_a_gemma3_mtp_sidecar_plans_for_its_target_and_nowhere_else(tmp_path):
    manifest = write_manifest(tmp_path, "gemma3-target", [{"kind": "mtp", "fixture": "gemma3-mtp-sidecar"}])
    plan, findings = compiled(manifest, write_profile(tmp_path, "mtp"))
    assert plan is not None, [f.render() for f in findings]
    (drafter,) = plan.drafters
    assert drafter.kind == "mtp" and drafter.contract == {"nextn_predict_layers": 1}
    ring = next(c for c in plan.memory.host if c.name == "drafter KV")
    assert "256 B per position" in ring.detail and "no sliding window" in ring.detail  # its one global block
    elsewhere = {"dense-target": "general.architecture is gemma3, the target's qwen3",
                 "hybrid-target": "general.architecture is gemma3, the target's qwen35"}
    for target, reason in elsewhere.items():
        manifest = write_manifest(tmp_path, target, [{"kind": "mtp", "fixture": "gemma3-mtp-sidecar"}])
        plan, findings = compiled(manifest, write_profile(tmp_path, "mtp"))
        assert plan is None and "PWR211" in errors(findings)
        assert any(reason in f.message for f in findings)


@pytest.mark.parametrize("tokens, problem", [([7, 3, 11], None), ([7, 3, 7], "twice"),
                                             ([7, 1_000_000], "outside the vocabulary")])
def test_an_mtp_sidecars_draft_vocabulary_names_distinct_token_ids_of_the_target(tmp_path, tokens, problem):
    from power.drafters.export import write_mtp_sidecar
    from power.runtime.gguf_weights import GGUFFile

    source = GGUFFile(fixture("gemma3-mtp-sidecar"))
    path = write_mtp_sidecar(tmp_path / "ranked.gguf", {name: source.tensor(name) for name in source.tensors},
                             fixture("gemma3-target"), "ranked", tokens)
    manifest = write_manifest(tmp_path, "gemma3-target", [{"kind": "mtp", "fixture": "gemma3-mtp-sidecar",
                                                           "path": str(path), "sha256": digest(path)}])
    plan, findings = compiled(manifest, write_profile(tmp_path, "mtp"))
    if problem is None:
        assert plan is not None, [f.render() for f in findings]
        return
    assert plan is None and errors(findings) == ["PWR211"]
    assert any(problem in f.message and "gemma3.draft_tokens" in f.message for f in findings)
