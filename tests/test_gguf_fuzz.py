"""Fuzzing the reader: truncation at every header offset, mutated real headers, random bytes.

The property: `inspect_artifact` (the reader, then facts, tokenizer facts and the drafter
contract) returns facts or raises ArtifactError with a PWR1xx finding naming the file -
never another exception, a hang or a large allocation.
"""

from __future__ import annotations

import os
import struct

import pytest
from gguf_helpers import fixtures, gemma
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from power.artifacts.contracts import contract_violations
from power.artifacts.facts import inspect_artifact
from power.artifacts.gguf_reader import ArtifactError, read_header
from power.modes import HEADER_CONTRACT

pytestmark = pytest.mark.slow  # outside `scripts/test --fast`: interpreter-heavy or runs the real model for long


def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _read_or_finding(path) -> str:
    try:
        facts = inspect_artifact(path)
        for kind in sorted(HEADER_CONTRACT):
            contract_violations(facts, kind)
    except ArtifactError as error:
        assert error.finding.code.startswith("PWR1")
        assert error.finding.file == str(path)
        return error.finding.code
    return "ok"


def _header_bytes(path) -> bytes:
    head = read_header(path)
    with open(path, "rb") as handle:
        return handle.read(head.data_offset)


def test_truncation_at_every_offset_of_a_real_header(tmp_path):
    source = fixtures()["dflash-drafter"]
    content = source.read_bytes()
    data_offset = read_header(source).data_offset
    path = tmp_path / "cut.gguf"
    path.write_bytes(content[:data_offset])
    codes = set()
    for keep in range(data_offset - 1, -1, -1):
        os.truncate(path, keep)
        code = _read_or_finding(path)
        assert code != "ok", keep
        codes.add(code)
    # cut inside the header: truncated, or a count the shortened file cannot hold; at its end: data missing
    assert codes <= {"PWR104", "PWR105", "PWR109"} and "PWR104" in codes


def _mutate(data: bytes, edits: list[tuple[int, int]]) -> bytes:
    mutated = bytearray(data)
    for position, value in edits:
        mutated[position % len(mutated)] = value
    return bytes(mutated)


edits = st.lists(st.tuples(st.integers(min_value=0, max_value=2**31), st.integers(0, 255)), min_size=1, max_size=8)


@fuzz(300)
@given(edits=edits, cut=st.one_of(st.none(), st.integers(min_value=0, max_value=2**20)))
def test_mutated_fixture_headers(tmp_path, edits, cut):
    names = ("dense-target", "hybrid-target", "dflash2-drafter", "dspark-drafter")
    source = fixtures()[names[len(edits) % len(names)]]
    data = _mutate(source.read_bytes(), edits)
    path = tmp_path / "mutated.gguf"
    path.write_bytes(data if cut is None else data[:cut])
    _read_or_finding(path)


@fuzz(300)
@given(edits=edits)
def test_mutated_counts_and_lengths(tmp_path, edits):
    """Mutations aimed at the first 64 bytes: counts, the first key's length and type."""
    data = fixtures()["dflash-drafter"].read_bytes()
    path = tmp_path / "mutated.gguf"
    path.write_bytes(_mutate(data, [(position % 64, value) for position, value in edits]))
    _read_or_finding(path)


@fuzz(12)
@given(edits=st.lists(st.tuples(st.integers(min_value=0, max_value=6_525_119), st.integers(0, 255)), min_size=1,
                      max_size=4))
def test_mutated_gemma_header(tmp_path, edits):
    path = tmp_path / "gemma-mutated.gguf"
    path.write_bytes(_mutate(_gemma_header(), edits))
    _read_or_finding(path)


def _gemma_header() -> bytes:
    global _GEMMA_HEADER
    if _GEMMA_HEADER is None:
        _GEMMA_HEADER = _header_bytes(gemma())
    return _GEMMA_HEADER


_GEMMA_HEADER: bytes | None = None


@fuzz(300)
@given(body=st.binary(max_size=4096), version=st.sampled_from([3, 3, 3, 2]))
def test_random_bytes_behind_a_valid_preamble(tmp_path, body, version):
    path = tmp_path / "random.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<I", version) + body)
    _read_or_finding(path)


@fuzz(100)
@given(body=st.binary(max_size=512))
def test_random_bytes(tmp_path, body):
    path = tmp_path / "random.gguf"
    path.write_bytes(body)
    assert _read_or_finding(path) != "ok"
