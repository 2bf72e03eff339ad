"""PWR11x (declared vs file) and the reader's PWR10x, through the compiler, on factory artifacts."""

from __future__ import annotations

import json
import shutil

from click.testing import CliRunner
from plan_helpers import codes, compiled, fixture, write_manifest, write_profile

from power.app.cli import main


def only(findings, code):
    matches = [f for f in findings if f.code == code]
    assert len(matches) == 1, [f.render() for f in findings]
    return matches[0]


def test_clean_manifest_plans(tmp_path):
    manifest = write_manifest(tmp_path, "dense-target", [{"kind": "ngram"}], quant="Q8_0", architecture="qwen3")
    plan, findings = compiled(manifest, write_profile(tmp_path, "ngram"))
    assert plan is not None, [f.render() for f in findings]
    assert (plan.target.architecture, plan.target.quant) == ("qwen3", "Q8_0")
    assert plan.target.sha256 in manifest.read_text()


def test_missing_artifact_names_the_path_and_the_manifest_line(tmp_path):
    copy = tmp_path / "gone.gguf"
    shutil.copy(fixture("dense-target"), copy)
    manifest = write_manifest(tmp_path, "dense-target")
    manifest.write_text(manifest.read_text().replace(str(fixture("dense-target")), str(copy)))
    copy.unlink()
    plan, findings = compiled(manifest, write_profile(tmp_path, "none"))
    missing = only(findings, "PWR110")
    assert plan is None
    assert str(copy) in missing.message
    assert missing.file == str(manifest) and missing.line == 4
    assert "path =" in missing.render()


def test_declared_size_mismatch_says_by_how_much(tmp_path):
    actual = fixture("dense-target").stat().st_size
    manifest = write_manifest(tmp_path, "dense-target", size=actual + 10)
    plan, findings = compiled(manifest, write_profile(tmp_path, "none"))
    finding = only(findings, "PWR111")
    assert plan is None and "10 bytes smaller" in finding.message and finding.where == "target.size"


def test_declared_sha256_mismatch(tmp_path):
    manifest = write_manifest(tmp_path, "dense-target")
    lines = manifest.read_text().splitlines()
    assert lines[4].startswith("sha256 = ")
    lines[4] = 'sha256 = "' + "0" * 64 + '"'
    manifest.write_text("\n".join(lines) + "\n")
    plan, findings = compiled(manifest, write_profile(tmp_path, "none"))
    finding = only(findings, "PWR112")
    assert plan is None and finding.line == 5 and "hashes to" in finding.message


def test_declared_quant_and_architecture_against_the_header(tmp_path):
    manifest = write_manifest(tmp_path, "dense-target", quant="Q6_K", architecture="llama")
    plan, findings = compiled(manifest, write_profile(tmp_path, "none"))
    assert plan is None
    assert "declares Q8_0" in only(findings, "PWR113").message
    assert 'general.architecture = "qwen3"' in only(findings, "PWR114").message


def test_truncated_artifact_is_the_readers_finding_with_a_byte_offset(tmp_path):
    manifest = write_manifest(tmp_path, "truncated-data")
    plan, findings = compiled(manifest, write_profile(tmp_path, "none"))
    assert plan is None
    (finding,) = [f for f in findings if f.code.startswith("PWR10")]
    assert finding.file == str(fixture("truncated-data")) and finding.offset is not None
    assert codes(findings) == [finding.code]


def test_an_artifact_finding_also_names_the_manifest_line_that_points_at_it(tmp_path):
    not_gguf = tmp_path / "drafter.gguf"
    not_gguf.write_bytes(b"not a gguf at all")
    manifest = write_manifest(tmp_path, "dense-target", [{"kind": "dspark", "fixture": "dspark-drafter"}])
    manifest.write_text(manifest.read_text().replace(str(fixture("dspark-drafter")), str(not_gguf)))
    line = next(number for number, text in enumerate(manifest.read_text().splitlines(), 1) if str(not_gguf) in text)
    result = CliRunner().invoke(main, ["plan", str(manifest), str(write_profile(tmp_path, "dspark")),
                                       "--device", "24 GiB", "--json"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    (finding,) = json.loads(result.stdout)["findings"]
    assert finding["code"] == "PWR102" and finding["file"] == str(not_gguf) and finding["offset"] == 0
    assert finding["where"] == "drafters[0].path" and finding["declared_at"] == f"{manifest}:{line}:1"
    assert f"named by drafters[0].path at {manifest}:{line}:1" in result.stderr
