"""Provenance: an artifact's `source` (a Hub repository at a commit, or an HTTPS URL) is checked as the
manifest is read (PWR130-PWR133), sealed into the plan, and reported by `power verify`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from power.app.cli import main
from power.documents.plan import load_plan
from power.orchestrator.inputs.loading import load_manifest

ROOT = Path(__file__).resolve().parent.parent
GEMMA = ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA_SIZE = 253_113_024
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POWER_CACHE_DIR", str(tmp_path / "cache"))


def manifest(tmp_path: Path, source: str, digests: str = f'size = {GEMMA_SIZE}\nsha256 = "{GEMMA_SHA256}"\n') -> Path:
    path = tmp_path / "m.toml"
    path.write_text(f'schema = "power.manifest/v1"\nname = "gemma"\n[target]\npath = "{GEMMA}"\n{digests}'
                    f'[target.source]\n{source}\n[[drafters]]\nkind = "ngram"\n')
    return path


def codes(path: Path) -> list[str]:
    return [finding.code for finding in load_manifest(path).findings]


def test_a_pinned_hub_source_and_an_https_url_are_accepted(tmp_path):
    pinned = manifest(tmp_path, f'repo = "google/gemma-3-270m"\nrevision = "{COMMIT}"\nfilename = "g.gguf"')
    assert codes(pinned) == [] and load_manifest(pinned).model.target.source.revision == COMMIT
    assert codes(manifest(tmp_path, 'url = "https://example.org/models/g.gguf"')) == []
    assert codes(manifest(tmp_path, 'url = "http://127.0.0.1:8080/g.gguf"')) == []


def test_a_branch_revision_is_not_pinned_and_the_hint_is_pull_pin(tmp_path):
    loaded = load_manifest(manifest(tmp_path, 'repo = "google/gemma-3-270m"\nrevision = "main"'))
    [finding] = loaded.findings
    assert (finding.code, finding.where, finding.line) == ("PWR131", "target.source.revision", 9)
    assert "'main', a branch or tag" in finding.message and "power pull --pin" in finding.hint
    assert loaded.model is None
    assert codes(manifest(tmp_path, 'repo = "google/gemma-3-270m"')) == ["PWR131"]


def test_a_sourced_artifact_without_size_or_digest_is_refused_with_the_fix(tmp_path):
    loaded = load_manifest(manifest(tmp_path, f'repo = "o/n"\nrevision = "{COMMIT}"', digests=""))
    [finding] = loaded.findings
    assert finding.code == "PWR132" and "no size and sha256" in finding.message
    assert "power pull --pin" in finding.hint


def test_a_target_without_digest_or_source_still_needs_its_sha256(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(f'schema = "power.manifest/v1"\nname = "g"\n[target]\npath = "{GEMMA}"\n')
    [finding] = load_manifest(path).findings
    assert (finding.code, finding.where) == ("PWR021", "target.sha256") and "power pull --pin" in finding.hint


@pytest.mark.parametrize(("source", "code"), [
    ('repo = "o/n"\nurl = "https://example.org/g.gguf"', "PWR130"),
    ("", "PWR130"),
    ('url = "https://example.org/g.gguf"\nrevision = "main"', "PWR130"),
    ('url = "http://example.org/g.gguf"', "PWR133"),
    ('url = "ftp://example.org/g.gguf"', "PWR022"),
    ('repo = "not a repo"\nrevision = "' + COMMIT + '"', "PWR022"),
])
def test_a_malformed_source_is_named(tmp_path, source, code):
    assert code in codes(manifest(tmp_path, source))


def test_the_plan_seals_the_source_and_verify_reports_it(tmp_path):
    path = manifest(tmp_path, f'repo = "google/gemma-3-270m"\nrevision = "{COMMIT}"')
    plan_path = tmp_path / "plan.json"
    runner = CliRunner()
    planned = runner.invoke(main, ["plan", str(path), str(ROOT / "profiles" / "ngram.toml"), "--device", "24 GiB",
                                   "-o", str(plan_path)])
    assert planned.exit_code == 0, planned.output
    source = load_plan(plan_path).target.source
    assert (source.repo, source.revision, source.filename) == ("google/gemma-3-270m", COMMIT, GEMMA.name)
    verified = runner.invoke(main, ["verify", str(plan_path)])
    assert verified.exit_code == 0, verified.output
    assert f"from hf://google/gemma-3-270m@{COMMIT}/{GEMMA.name}" in verified.stdout
    report = json.loads(runner.invoke(main, ["verify", str(plan_path), "--json"]).stdout)
    assert report["artifacts"][0]["source"] == f"hf://google/gemma-3-270m@{COMMIT}/{GEMMA.name}"


def test_a_plan_without_sources_has_no_source_key(tmp_path):
    plan_path = tmp_path / "plan.json"
    planned = CliRunner().invoke(main, ["plan", str(ROOT / "manifests" / "gemma3-270m.toml"),
                                        str(ROOT / "profiles" / "ngram.toml"), "--device", "24 GiB", "-o",
                                        str(plan_path)])
    assert planned.exit_code == 0, planned.output
    assert "source" not in json.loads(plan_path.read_text())["target"]
