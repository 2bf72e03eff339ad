"""The header-only GGUF reader: agreement with gguf.GGUFReader, and a clear PWR10x finding for every bad file."""

from __future__ import annotations

import os
import struct

import gguf
import numpy as np
import pytest
from gguf_helpers import fixtures, gemma, gguf_string, header, kv_string, kv_u32, tensor_info, with_data

from power.artifacts.gguf_reader import MAX_LIST_ELEMENTS, ArtifactError, read_header


def _reference_value(field: gguf.ReaderField):
    value = field.contents()
    if field.types and field.types[0] == gguf.GGUFValueType.ARRAY and field.types[-1] == gguf.GGUFValueType.BOOL:
        return [bool(item) for item in value]
    return value


def assert_agrees_with_gguf_reader(path) -> None:
    ours, theirs = read_header(path), gguf.GGUFReader(path)
    reference = {key: field for key, field in theirs.fields.items() if not key.startswith("GGUF.")}
    assert list(ours.metadata) == list(reference)
    for key, field in reference.items():
        expected, actual = _reference_value(field), ours.metadata[key]
        if isinstance(actual, memoryview):  # a long numeric array: a read-only view of the header's bytes
            assert actual.readonly and len(actual) > MAX_LIST_ELEMENTS, key
            assert actual.obj is ours.raw, key
            np.testing.assert_array_equal(np.asarray(actual), np.asarray(expected, dtype=np.asarray(actual).dtype))
        elif isinstance(expected, float) or (isinstance(expected,
                                                        list) and expected and isinstance(expected[0], float)):
            np.testing.assert_array_equal(np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64))
        else:
            assert actual == expected, key
    assert ours.data_offset == theirs.data_offset
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, other in zip(ours.tensors, theirs.tensors, strict=True):
        assert list(mine.dims) == [int(d) for d in other.shape], mine.name
        assert mine.ggml_type == other.tensor_type
        assert ours.data_offset + mine.offset == other.data_offset, mine.name
        assert mine.nbytes == other.n_bytes, mine.name


@pytest.mark.parametrize("name", ["dense-target", "hybrid-target", "dflash-drafter", "dflash2-drafter",
                                  "dspark-drafter",
                                  "dflash-drafter-other-tokenizer", "qwen36-27b-q6k", "qwen36-27b-dflash2",
                                  "qwen36-27b-dspark"])
def test_every_field_agrees_with_gguf_reader_on_the_fixtures(name):
    assert_agrees_with_gguf_reader(fixtures()[name])


@pytest.mark.slow  # the real model's 262k-entry vocabulary through both readers
def test_every_field_agrees_with_gguf_reader_on_gemma():
    assert_agrees_with_gguf_reader(gemma())


def test_gemma_header_in_numbers():
    head = read_header(gemma())
    assert head.version == 3 and head.alignment == 32
    assert len(head.tensors) == 236
    assert head.metadata["general.architecture"] == "gemma3"
    assert len(head.metadata["tokenizer.ggml.tokens"]) == 262_144
    assert head.value_types["tokenizer.ggml.tokens"] == "array[string]"
    assert head.value_types["gemma3.attention.sliding_window"] == "uint32"
    assert head.data_offset + sum(t.nbytes for t in head.tensors) <= head.size


def _finding(tmp_path, content: bytes, name: str = "bad.gguf"):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ArtifactError) as raised:
        read_header(path)
    finding = raised.value.finding
    assert finding.file == str(path)
    return finding


def test_wrong_magic(tmp_path):
    finding = _finding(tmp_path, b"GGML" + bytes(20))
    assert (finding.code, finding.offset) == ("PWR102", 0)
    assert "magic" in finding.message and finding.hint


@pytest.mark.parametrize("version", [1, 2, 4])
def test_unsupported_versions(tmp_path, version):
    finding = _finding(tmp_path, header([], [], version=version))
    assert (finding.code, finding.offset) == ("PWR103", 4)
    assert str(version) in finding.message


def test_absurd_tensor_count(tmp_path):
    finding = _finding(tmp_path, header([kv_u32("a.b", 1)], [], n_tensors=2**60))
    assert (finding.code, finding.offset) == ("PWR105", 8)
    assert str(2**60) in finding.message


def test_absurd_metadata_count(tmp_path):
    assert _finding(tmp_path, header([], [], n_kv=2**62)).code == "PWR105"


def test_string_length_past_the_end(tmp_path):
    key = struct.pack("<Q", 2**40) + b"general.name"
    finding = _finding(tmp_path, header([key], []))
    assert (finding.code, finding.offset) == ("PWR105", 24)


def test_string_cut_by_the_end_of_file_is_truncation(tmp_path):
    content = header([kv_string("general.name", "abcdefgh")], [])
    finding = _finding(tmp_path, content[:-3])
    assert finding.code == "PWR104"


def test_unknown_value_type(tmp_path):
    kv = gguf_string("general.thing") + struct.pack("<I", 99) + b"\0" * 8
    finding = _finding(tmp_path, header([kv], []))
    assert finding.code == "PWR106" and "99" in finding.message
    assert finding.offset == 24 + len(gguf_string("general.thing"))


def test_arrays_nested_too_deep(tmp_path):
    inner = struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 4, 1) + struct.pack("<I", 7)
    kv = gguf_string("deep") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) + inner
    assert _finding(tmp_path, header([kv], [])).code == "PWR106"


def test_duplicate_metadata_key(tmp_path):
    finding = _finding(tmp_path, header([kv_u32("a.b", 1), kv_u32("a.b", 2)], []))
    assert finding.code == "PWR107" and "'a.b'" in finding.message
    assert finding.offset == 24 + len(kv_u32("a.b", 1))


def test_duplicate_tensor_name(tmp_path):
    tensors = [tensor_info("w", (32,), 0, 0), tensor_info("w", (32,), 0, 128)]
    assert _finding(tmp_path, with_data(header([], tensors), 256)).code == "PWR107"


def test_unknown_quant_type(tmp_path):
    finding = _finding(tmp_path, with_data(header([], [tensor_info("w", (32,), 250, 0)]), 1024))
    assert finding.code == "PWR108" and "250" in finding.message


def test_row_not_whole_blocks(tmp_path):
    q8_0 = int(gguf.GGMLQuantizationType.Q8_0)
    assert _finding(tmp_path, with_data(header([], [tensor_info("w", (33, 2), q8_0, 0)]), 1024)).code == "PWR108"


@pytest.mark.parametrize("dims", [(), (1, 1, 1, 1, 1), (0, 4)])
def test_bad_dimensions(tmp_path, dims):
    assert _finding(tmp_path, with_data(header([], [tensor_info("w", dims, 0, 0)]), 1024)).code == "PWR108"


def test_tensor_data_past_the_end(tmp_path):
    finding = _finding(tmp_path, with_data(header([], [tensor_info("w", (64,), 0, 0)]), 100))
    assert finding.code == "PWR109" and "'w'" in finding.message


def test_misaligned_and_overlapping_tensors(tmp_path):
    misaligned = with_data(header([], [tensor_info("w", (8,), 0, 4)]), 64)
    assert _finding(tmp_path, misaligned, "a.gguf").code == "PWR109"
    overlapping = with_data(header([], [tensor_info("a", (32,), 0, 0), tensor_info("b", (32,), 0, 64)]), 256)
    assert "overlaps" in _finding(tmp_path, overlapping, "b.gguf").message


def test_bad_alignment(tmp_path):
    assert _finding(tmp_path, header([kv_u32("general.alignment", 24)], [])).code == "PWR117"


def test_empty_file(tmp_path):
    assert _finding(tmp_path, b"").code == "PWR104"


def test_a_directory(tmp_path):
    with pytest.raises(ArtifactError) as raised:
        read_header(tmp_path)
    assert raised.value.finding.code == "PWR101" and "directory" in raised.value.finding.message


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    with pytest.raises(ArtifactError) as raised:
        read_header(fifo)
    assert raised.value.finding.code == "PWR101" and "FIFO" in raised.value.finding.message


def test_a_missing_file(tmp_path):
    with pytest.raises(ArtifactError) as raised:
        read_header(tmp_path / "nope.gguf")
    assert raised.value.finding.code == "PWR100"


def test_truncated_fixtures_name_the_place():
    for name, code in (("truncated-header", "PWR104"), ("truncated-data", "PWR109")):
        with pytest.raises(ArtifactError) as raised:
            read_header(fixtures()[name])
        assert raised.value.finding.code == code
        assert raised.value.finding.offset is not None
