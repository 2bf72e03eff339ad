"""`power inspect` and `power fixtures build` through the click command line."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import gguf
import pytest
from click.testing import CliRunner
from gguf_helpers import fixtures, gemma, gguf_string, header, kv_string, tensor_info, with_data

from power.app.cli import main
from power.artifacts.gguf_reader import MAX_ARRAY_OBJECTS, MAX_METADATA_KEYS, MAX_TENSORS


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POWER_CACHE_DIR", str(tmp_path / "cache"))


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_report_sections_for_a_dflash2_drafter():
    result = run("inspect", str(fixtures()["dflash2-drafter"]))
    assert result.exit_code == 0, result.output
    out = result.stdout
    for heading in ("artifact", "hyper-parameters (dflash)", "layers: 2 sliding", "tensor census", "tokenizer",
                    "drafter contract"):
        assert heading in out
    assert "dflash2 - DFlash2" in out and "32 positions" in out and "256 B per position" in out
    assert "selector_rank" in out and "sha256(first 2000 tokens)=" in out


def test_report_for_the_hybrid_target_shows_every_layer_kind():
    out = run("inspect", "--no-hash", str(fixtures()["hybrid-target"])).stdout
    assert "layers: 3 recurrent, 1 global, 3 recurrent" not in out  # counts are totals, not runs
    assert "layers: 6 recurrent, 2 global, 1 nextn" in out
    assert "mtp - MTP/nextn head inside the target" in out and "(not hashed: --no-hash)" in out


def test_json_is_one_object_with_the_digest():
    path = fixtures()["dspark-drafter"]
    data = json.loads(run("inspect", "--json", str(path)).stdout)
    assert data["drafter_kind"] == "dspark" and data["sliding_window"] is None and data["findings"] == []
    assert data["sha256"] == json.loads(run("inspect", "--json", "--no-cache", str(path)).stdout)["sha256"]
    assert len(data["sha256"]) == 64 and data["tokenizer"]["vocab_size"] == 496


def test_gemma_report():
    data = json.loads(run("inspect", "--json", "--no-hash", str(gemma())).stdout)
    assert data["architecture"] == "gemma3" and data["tokenizer"]["vocab_size"] == 262_144
    assert [row["ggml_type"] for row in data["census"]][:2] == ["Q8_0", "Q5_0"]
    assert data["sliding_window"] == 512 and data["drafter_kind"] is None
    assert [layer["kind"] for layer in data["layers"]].count("global") == 3


def test_the_file_type_is_shown_with_its_name():
    """Issue 40 (low): `inspect` showed "file type 15" without the name llama.cpp gives it."""
    text = run("inspect", "--no-hash", str(gemma())).stdout
    assert next(line for line in text.splitlines() if "file type" in line).split()[-2:] == ["15", "(Q4_K_M)"]


@pytest.mark.parametrize(("name", "code"), [("truncated-header", "PWR104"), ("truncated-data", "PWR109")])
def test_a_bad_file_exits_1_with_its_finding(name, code):
    path = str(fixtures()[name])
    text = run("inspect", path)
    assert text.exit_code == 1 and text.stdout == ""
    assert text.stderr.startswith(f"{path}:byte ") and code in text.stderr and "hint:" in text.stderr
    data = json.loads(run("inspect", "--json", path).stdout)
    assert [finding["code"] for finding in data["findings"]] == [code]


def test_a_long_numeric_array_is_counted_and_hashed_never_listed(tmp_path):
    data = bytes(range(256)) * 40_000  # 10 MB: one uint8 array
    key = gguf_string("llama.big") + struct.pack("<IIQ", 9, 0, len(data)) + data
    path = tmp_path / "array.gguf"
    path.write_bytes(header([kv_string("general.architecture", "llama"), key], []))
    result = run("inspect", "--json", "--no-hash", str(path))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["metadata"]["llama.big"] == {
        "elements": "uint8", "count": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert "[0, 1, 2, 3, 4, 5, 6, 7, ...] (10,240,000 uint8 items)" in run("inspect", "--no-hash", str(path)).stdout


def _counted(what: str, count: int) -> bytes:
    arch = kv_string("general.architecture", "llama")
    if what == "tensors":
        return b"GGUF" + struct.pack("<IQQ", 3, count, 1) + arch
    if what == "keys":
        return b"GGUF" + struct.pack("<IQQ", 3, 0, count) + arch
    strings = gguf_string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, count)
    return header([arch, strings], []) + b"\0" * 8 * count  # every string empty


@pytest.mark.parametrize(("what", "count", "code"), [
    ("tensors", MAX_TENSORS + 1, "PWR105"), ("keys", MAX_METADATA_KEYS + 1, "PWR105"),
    ("strings", MAX_ARRAY_OBJECTS + 1, "PWR105")])
def test_a_header_past_a_cap_is_refused_before_anything_is_built_for_it(tmp_path, what, count, code):
    path = tmp_path / f"{what}.gguf"
    with open(path, "wb") as handle:
        handle.write(_counted(what, count))
        handle.truncate(max(handle.tell(), 64 * count))
    result = run("inspect", "--no-hash", str(path))
    assert result.exit_code == 1 and code in result.stderr and "no real model has more than" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize("index", ["4000000000", "9" * 5000])
def test_a_layer_index_past_the_cap_is_refused(tmp_path, index):
    head = header([kv_string("general.architecture", "llama")], [tensor_info(f"blk.{index}.w", (8,), 0, 0)])
    path = tmp_path / "layers.gguf"
    path.write_bytes(with_data(head, 32))
    result = run("inspect", "--no-hash", str(path))
    assert result.exit_code == 1 and "PWR123" in result.stderr and "at most 4096 layers" in result.stderr
    assert "Traceback" not in result.output


def test_a_directory_exits_1(tmp_path):
    result = run("inspect", str(tmp_path))
    assert result.exit_code == 1 and "PWR101" in result.stderr


def test_fixtures_build_lists_every_fixture(tmp_path):
    result = run("fixtures", "build", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["name", "path", "size", "sha256", "kind"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) == set(fixtures())
    assert rows["dflash-named-dspark"].rstrip().endswith("dspark")
    assert rows["hybrid-target"].rstrip().endswith("target (qwen35) + mtp head")
    assert "invalid (PWR104)" in rows["truncated-header"]
    assert "(header only: --hash-sparse)" in rows["qwen36-27b-q6k"]


def test_fixtures_build_json(tmp_path):
    rows = json.loads(run("fixtures", "build", "--json", str(tmp_path / "out")).stdout)
    by_name = {row["name"]: row for row in rows}
    assert by_name["dflash2-drafter"]["kind"] == "dflash2" and len(by_name["dflash2-drafter"]["sha256"]) == 64



def _vocabulary_gguf(path: Path, types: list, element_type: gguf.GGUFValueType) -> Path:
    """A header-only GGUF whose vocabulary's token types are stored as `element_type`."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(len(types))])
    writer.add_key_value("tokenizer.ggml.token_type", types, gguf.GGUFValueType.ARRAY, sub_type=element_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


def test_token_types_of_another_element_type_are_fingerprinted_not_a_traceback(tmp_path):
    def fingerprint(name: str, types: list, element_type: gguf.GGUFValueType) -> str:
        result = run("inspect", "--json", str(_vocabulary_gguf(tmp_path / name, types, element_type)))
        assert result.exit_code == 0, result.output
        return json.loads(result.output)["tokenizer"]["fingerprint"]

    types = [1, 1, 3, 4, 1]
    as_int32 = fingerprint("int32.gguf", types, gguf.GGUFValueType.INT32)
    assert fingerprint("int64.gguf", types, gguf.GGUFValueType.INT64) == as_int32  # the width does not matter
    as_strings = fingerprint("strings.gguf", [f"kind-{t}" for t in types], gguf.GGUFValueType.STRING)
    assert as_strings != as_int32
