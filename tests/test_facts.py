"""ArtifactFacts, tokenizer facts and the drafter contracts, read from real files."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from gguf_helpers import fixtures, gemma

from power import modes
from power.artifacts import contracts, factory
from power.artifacts.facts import inspect_artifact
from power.artifacts.gguf_reader import read_header
from power.artifacts.tokenizer_facts import compare_tokenizers


def facts(name):
    return inspect_artifact(fixtures()[name])


@pytest.mark.parametrize(("name", "kind", "window", "kv_per_position"), [
    ("dense-target", None, None, 0),
    ("hybrid-target", "mtp", None, 1 * 2 * 2 * 16 * 2),
    ("dflash-drafter", "dflash", 32, 2 * 2 * 2 * 16 * 2),
    ("dflash2-drafter", "dflash2", 32, 2 * 2 * 2 * 16 * 2),
    ("dspark-drafter", "dspark", None, 2 * 2 * 2 * 16 * 2),
    ("dflash-named-dspark", "dspark", None, 2 * 2 * 2 * 16 * 2),
    ("qwen36-27b-q6k", "mtp", None, 1 * 2 * 4 * 256 * 2),
    ("qwen36-27b-dflash", "dflash", 2048, 5 * 2 * 8 * 128 * 2),
    ("qwen36-27b-dflash2", "dflash2", 2048, 5 * 2 * 8 * 128 * 2),
    ("qwen36-27b-dspark", "dspark", None, 20 * 1024),
])
def test_the_header_decides_the_drafter_contract(name, kind, window, kv_per_position):
    found = facts(name)
    assert (found.drafter_kind, found.sliding_window,
            found.drafter_kv_bytes_per_position) == (kind, window, kv_per_position)


def test_dspark_drafter_kv_at_the_reference_context_is_five_gib():
    assert facts("qwen36-27b-dspark").drafter_kv_bytes_per_position * 262_144 == 5 * 2**30


@pytest.mark.parametrize("name", ["hybrid-target", "dflash-drafter", "dflash2-drafter", "dspark-drafter",
                                  "qwen36-27b-q6k", "qwen36-27b-dflash", "qwen36-27b-dflash2", "qwen36-27b-dspark"])
def test_every_fixture_satisfies_its_own_contract_and_no_other(name):
    found = facts(name)
    assert contracts.contract_violations(found, found.drafter_kind) == []
    for other in modes.HEADER_CONTRACT - {found.drafter_kind}:
        codes = [finding.code for finding in contracts.contract_violations(found, other)]
        assert codes and set(codes) <= {"PWR210", "PWR212"}, other


def test_a_dspark_file_labelled_dflash_is_rejected_by_its_header():
    [finding] = contracts.contract_violations(facts("dflash-named-dspark"), "dflash")
    assert finding.code == "PWR210"
    assert "dspark" in finding.message and finding.file.endswith("dflash-named-dspark.gguf")


def test_dflash_v1_and_dflash2_are_not_interchangeable():
    assert [f.code for f in contracts.contract_violations(facts("dflash-drafter"), "dflash2")] == ["PWR210"]
    assert [f.code for f in contracts.contract_violations(facts("dflash2-drafter"), "dflash")] == ["PWR210"]


def test_mtp_on_a_target_without_a_head():
    [finding] = contracts.contract_violations(facts("dense-target"), "mtp")
    assert finding.code == "PWR212"


def test_non_file_kinds_have_no_header_contract():
    assert contracts.contract_violations(facts("dense-target"), "ngram") == []


def test_real_drafter_tensor_counts_match_the_reference():
    assert len(facts("qwen36-27b-dflash").tensors) == 58
    assert len(facts("qwen36-27b-dflash2").tensors) == 81
    assert len(facts("qwen36-27b-q6k").tensors) == 851 + 15  # the reference 851 without MTP + one nextn block


def _rewrite_drafter(tmp_path, kind, *, drop_tensor=None, reshape=None, drop_key=None):
    """A fixture drafter rebuilt with one thing wrong."""
    hp = factory.fixture_drafter_hparams(kind)
    shapes = contracts.drafter_tensors(kind, hp)
    if drop_tensor:
        del shapes[drop_tensor]
    if reshape:
        shapes[reshape[0]] = reshape[1]
    metadata = contracts.drafter_metadata(kind, hp)
    if drop_key:
        del metadata[drop_key]
    tensors = {name: factory.Tensor(np.zeros(shape, dtype="float32")) for name, shape in shapes.items()}
    path = factory.write_gguf(tmp_path / f"{kind}-broken.gguf", modes.ARCHITECTURE_OF[kind], metadata, tensors)
    return inspect_artifact(path)


def test_a_missing_contract_tensor_is_named(tmp_path):
    broken = _rewrite_drafter(tmp_path, "dspark", drop_tensor="markov.hidden.weight")
    [finding] = contracts.contract_violations(broken, "dspark")
    assert finding.code == "PWR211" and "markov.hidden.weight" in finding.message


def test_a_wrong_tensor_shape_is_named(tmp_path):
    broken = _rewrite_drafter(tmp_path, "dflash2", reshape=("selector_hidden.weight", (4, 64)))
    [finding] = contracts.contract_violations(broken, "dflash2")
    assert finding.code == "PWR211" and "selector_hidden.weight" in finding.message and "[8, 64]" in finding.message


def test_a_missing_contract_key_is_named(tmp_path):
    broken = _rewrite_drafter(tmp_path, "dflash", drop_key="dflash.attention.sliding_window")
    findings = contracts.contract_violations(broken, "dflash")
    assert [f.code for f in findings] == ["PWR211"] and "dflash.attention.sliding_window" in findings[0].message


def test_hybrid_layers_and_census():
    found = facts("hybrid-target")
    assert [layer.kind for layer in found.layers] == ["recurrent"] * 3 + ["global"] + ["recurrent"] * 3 + [
        "global",
        "nextn",
    ]
    assert [layer.n_head_kv for layer in found.layers][:4] == [0, 0, 0, 2]
    assert sum(row.count for row in found.census) == len(found.tensors)
    assert (
        sum(row.nbytes for row in found.census)
        == found.tensor_bytes
        == sum(layer.nbytes for layer in found.layers)
        + sum(t.nbytes for t in found.tensors if not t.name.startswith("blk."))
    )


def test_dense_target_census_has_every_small_block_quant():
    types = {row.ggml_type for row in facts("dense-target").census}
    assert {"Q4_0", "Q5_0", "Q8_0", "F16", "F32"} <= types


def test_gemma_facts():
    found = inspect_artifact(gemma())
    assert found.architecture == "gemma3" and found.drafter_kind is None
    kinds = [layer.kind for layer in found.layers]
    assert len(kinds) == 18 and kinds == (["sliding"] * 5 + ["global"]) * 3
    assert {layer.n_head_kv for layer in found.layers} == {1} and found.layers[0].head_dim_k == 256
    tok = found.tokenizer
    assert (tok.model, tok.pre, tok.vocab_size, tok.merges_count) == ("llama", "default", 262_144, 0)
    assert tok.special_ids == {"bos": 2, "eos": 1, "unk": 3, "pad": 0}
    assert (tok.add_bos, tok.add_eos) == (True, False)
    tokens = read_header(gemma()).metadata["tokenizer.ggml.tokens"]  # equal to gguf.GGUFReader's: test_gguf_reader
    assert tok.short_fingerprint == hashlib.sha256("\n".join(tokens[:2000]).encode()).hexdigest()[:16]
    json.dumps(found.to_json())
    assert "tokenizer.ggml.tokens" not in found.metadata


def test_tokenizer_fingerprint_is_over_the_whole_vocabulary():
    same = facts("dflash-drafter").tokenizer
    other = facts("dflash-drafter-other-tokenizer").tokenizer
    assert same.fingerprint == facts("dense-target").tokenizer.fingerprint
    assert other.fingerprint != same.fingerprint
    # the vocabulary has 496 tokens, all inside the short fingerprint's first 2000
    assert other.short_fingerprint != same.short_fingerprint
    differences = compare_tokenizers(same, other)
    assert differences == [
        "first differing token at id 491: 'retu' vs 'QZ'",
        "first differing merge at index 235: 'ret u' vs 'Q Z'",
    ]
    assert compare_tokenizers(same, facts("hybrid-target").tokenizer) == []


def test_the_fingerprint_covers_special_ids_and_flags(tmp_path):
    tok = factory.fixture_tokenizer()
    metadata = factory.tokenizer_metadata(tok) | {"tokenizer.ggml.eos_token_id": 493}
    path = factory.write_gguf(tmp_path / "eos.gguf", "qwen3", metadata, {"w": factory.Tensor(np.zeros(32, "float32"))})
    moved = inspect_artifact(path).tokenizer
    assert moved.short_fingerprint == facts("dense-target").tokenizer.short_fingerprint
    assert compare_tokenizers(facts("dense-target").tokenizer, moved) == ["special id eos: 494 vs 493"]


def test_facts_are_json_serialisable_and_frozen():
    found = facts("dflash2-drafter")
    data = json.loads(json.dumps(found.to_json()))
    assert data["drafter_kind"] == "dflash2" and data["tokenizer"]["vocab_size"] == 496
    with pytest.raises(AttributeError):
        found.architecture = "llama"


def test_a_drafter_pairs_only_with_a_target_of_its_shape():
    assert contracts.pairing_violations(facts("dflash-drafter"), facts("dense-target")) == []
    assert contracts.pairing_violations(facts("dspark-drafter"), facts("hybrid-target")) == []
    assert contracts.pairing_violations(facts("qwen36-27b-dflash2"), facts("qwen36-27b-q6k")) == []
    messages = [f.message for f in contracts.pairing_violations(facts("qwen36-27b-dspark"), facts("dense-target"))]
    assert len(messages) == 3 and {
        f.code for f in contracts.pairing_violations(facts("qwen36-27b-dspark"), facts("dense-target"))
    } == {"PWR211"}
    assert "width 5120" in messages[0] and "vocab_size 248320" in messages[1] and "[16, 31, 46, 61]" in messages[2]
    assert contracts.pairing_violations(facts("hybrid-target"), facts("dense-target")) == []
