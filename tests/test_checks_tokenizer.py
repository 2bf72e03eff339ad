"""PWR31x: the complete vocabularies of drafter and target must be identical."""

from __future__ import annotations

from plan_helpers import compiled, write_manifest, write_profile


def test_tokenizer_mismatch_over_the_complete_vocabulary_fails_closed(tmp_path):
    manifest = write_manifest(tmp_path, "hybrid-target", [{"kind": "dflash",
                                                           "fixture": "dflash-drafter-other-tokenizer"}])
    plan, findings = compiled(manifest, write_profile(tmp_path, "dflash"))
    assert plan is None
    (finding,) = [f for f in findings if f.is_error]
    assert finding.code == "PWR310"
    # The last ids differ, past llama.cpp's "from token 5" window: named exactly.
    assert "first differing token at id 491" in finding.message and "merge" in finding.message


def test_identical_tokenizers_plan_and_record_the_fingerprint(tmp_path):
    manifest = write_manifest(tmp_path, "hybrid-target", [{"kind": "dflash", "fixture": "dflash-drafter"}])
    plan, findings = compiled(manifest, write_profile(tmp_path, "dflash"))
    assert plan is not None, [f.render() for f in findings]
    assert plan.tokenizer.vocab_size == 496 and len(plan.tokenizer.sha256) == 64 and plan.tokenizer.model == "gpt2"
