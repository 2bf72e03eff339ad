"""The artifact factory: deterministic, small, complete, runnable fixtures and real-size header-only files."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf_helpers import HEADER_ONLY, RUNNABLE, fixtures
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from power.artifacts import factory
from power.artifacts.facts import inspect_artifact
from power.artifacts.gguf_reader import read_header

QUANTISED = (gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q5_0, gguf.GGMLQuantizationType.Q8_0)


def _prefix(path, size: int) -> bytes:
    with open(path, "rb") as handle:
        return handle.read(size)


def test_building_twice_writes_identical_files(tmp_path):
    again = factory.build_fixtures(tmp_path)
    for name, path in fixtures().items():
        if name in HEADER_ONLY:
            head = read_header(path).data_offset
            assert _prefix(again[name], head) == _prefix(path, head)
            assert again[name].stat().st_size == path.stat().st_size
        else:
            assert again[name].read_bytes() == path.read_bytes(), name
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left behind


@pytest.mark.parametrize("name", RUNNABLE)
def test_runnable_fixtures_are_small_finite_and_sensibly_scaled(name):
    path = fixtures()[name]
    assert path.stat().st_size < 2_000_000
    for tensor in gguf.GGUFReader(path).tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        assert np.isfinite(values).all(), tensor.name
        if tensor.name.endswith("norm.weight"):
            assert (values == 1).all(), tensor.name
        elif values.size >= 1024:
            assert 0.015 < values.std() < 0.025, tensor.name


@pytest.mark.parametrize("name", ["dense-target", "hybrid-target", "dflash2-drafter"])
def test_quantised_tensors_are_real_quantisations(name):
    """Re-quantising the dequantised values gives the stored blocks back: they came from gguf.quants.quantize."""
    checked = 0
    for tensor in gguf.GGUFReader(fixtures()[name]).tensors:
        if tensor.tensor_type in QUANTISED:
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            np.testing.assert_array_equal(gguf.quants.quantize(values, tensor.tensor_type), tensor.data)
            checked += 1
    assert checked


def test_dense_target_layers_cycle_through_the_small_block_quants():
    types = {t.name: t.type_name for t in read_header(fixtures()["dense-target"]).tensors}
    assert [types[f"blk.{i}.attn_q.weight"] for i in range(4)] == ["Q4_0", "Q5_0", "Q8_0", "F16"]


def test_hybrid_recurrent_decay_is_negative():
    reader = gguf.GGUFReader(fixtures()["hybrid-target"])
    decays = [t.data for t in reader.tensors if t.name.endswith(".ssm_a")]
    assert len(decays) == 6 and all((d < 0).all() for d in decays)


def test_the_fixture_tokenizer_round_trips_through_tokenizers():
    meta = read_header(fixtures()["dense-target"]).metadata
    tokens = meta["tokenizer.ggml.tokens"]
    bpe = models.BPE(vocab={token: i for i, token in enumerate(tokens)},
                     merges=[tuple(merge.split(" ")) for merge in meta["tokenizer.ggml.merges"]])
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    text = "Hello world! The drafter proposes a block; déjà vu 123."
    ids = tokenizer.encode(text).ids
    assert tokenizer.decode(ids) == text
    assert len(ids) < 0.6 * len(text.encode())  # the merges do real work
    assert tokens[meta["tokenizer.ggml.eos_token_id"]] == "<|im_end|>"


def test_the_other_tokenizer_differs_in_exactly_one_token():
    ours = read_header(fixtures()["dflash-drafter"]).metadata["tokenizer.ggml.tokens"]
    theirs = read_header(fixtures()["dflash-drafter-other-tokenizer"]).metadata["tokenizer.ggml.tokens"]
    assert len(ours) == len(theirs)
    assert [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b] == [491]


def test_header_only_fixtures_are_sparse_and_real_sized():
    target = fixtures()["qwen36-27b-q6k"]
    assert target.stat().st_size == factory.QWEN36_27B_Q6K_SIZE == 22_884_408_288
    for name in HEADER_ONLY:
        assert fixtures()[name].stat().st_blocks * 512 < 1_000_000, name
    facts = inspect_artifact(target)
    assert [row.ggml_type for row in facts.census] == ["Q6_K", "F32"]
    assert facts.hparam("embedding_length") == 5120 and facts.hparam("vocab_size") == 248_320
    kinds = [layer.kind for layer in facts.layers]
    assert kinds.count("recurrent") == 48 and kinds.count("global") == 16 and kinds[-1] == "nextn"


def test_the_sparse_writer_refuses_a_size_below_its_tensors(tmp_path):
    with pytest.raises(ValueError):
        factory.write_sparse_gguf(tmp_path / "x.gguf", "llama", {}, {"w": ((1024, 1024), factory.F16)}, total_size=1000)
    assert list(tmp_path.iterdir()) == []
