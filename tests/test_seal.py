"""The seal, through the CLI: an artifact that changed after planning never runs or verifies.

The cache may only speed up what reads artifacts before a plan exists; where a plan
is launched or verified every artifact is hashed in full. `render` checks each is
there at its planned size and leaves the bytes to `power verify`, the gate before a
rendered engine starts (issue 23 defect 12: render re-hashed every artifact on every
call).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from gguf_helpers import fixtures, gemma

from power.app.cli import main
from power.documents.plan import ResolvedPlan, load_plan, save_plan

GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POWER_CACHE_DIR", str(tmp_path / "cache"))


def power(*args: str):
    result = CliRunner().invoke(main, [str(arg) for arg in args])
    assert "Traceback" not in result.output
    return result


def codes(result) -> list[str]:
    return [finding["code"] for finding in json.loads(result.stdout)["findings"]]


def sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def overwrite_keeping_mtime(path: Path, offset: int, data: bytes) -> None:
    """Change bytes in place, then set the old atime/mtime back (what `touch -d` does)."""
    before = os.stat(path)
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == before.st_mtime_ns


def gemma_plan(directory: Path, model: Path, engine: str = "power") -> Path:
    manifest = directory / "gemma.manifest.toml"
    manifest.write_text(f'schema = "power.manifest/v1"\nname = "gemma"\n[target]\npath = "{model.name}"\n'
                        f'sha256 = "{GEMMA_SHA256}"\n')
    profile = directory / "plain.profile.toml"
    profile.write_text('schema = "power.profile/v1"\nname = "plain"\nspec_mode = "none"\n[runtime]\nctx = 256\n')
    plan = directory / f"{engine}.plan.json"
    result = power("plan", manifest, profile, "--device", "4 GiB", "--engine", engine, "-o", plan)
    assert result.exit_code == 0, result.output
    return plan


def test_an_in_place_change_with_its_mtime_restored_is_seen_by_inspect_plan_and_run(tmp_path):
    model = tmp_path / "gemma.gguf"
    shutil.copyfile(gemma(), model)
    plan = gemma_plan(tmp_path, model)  # the digest cache now holds the file's sha256
    assert json.loads(power("inspect", "--json", model).stdout)["sha256"] == GEMMA_SHA256

    overwrite_keeping_mtime(model, model.stat().st_size // 2, os.urandom(1 << 20))
    tampered = sha256(model)
    assert tampered != GEMMA_SHA256

    assert json.loads(power("inspect", "--json", model).stdout)["sha256"] == tampered
    replanned = power("plan", tmp_path / "gemma.manifest.toml", tmp_path / "plain.profile.toml", "--device", "4 GiB",
                      "--json")
    assert replanned.exit_code == 1 and codes(replanned) == ["PWR112"]
    run = power("run", plan, "--prompt", "Hello", "--max-tokens", "2", "--json")
    assert run.exit_code == 2 and codes(run) == ["PWR115"]
    assert "the plan expects a5fd3b62" in run.stderr
    verify = power("verify", plan, "--json")
    assert verify.exit_code == 1 and codes(verify) == ["PWR115"]
    assert json.loads(verify.stdout)["verified"] is False


def fixture_plan(directory: Path, engine: str = "llama-server") -> Path:
    """The dense fixture target with its DFlash drafter, copied into `directory` and planned there."""
    for name in ("dense-target", "dflash-drafter"):
        shutil.copyfile(fixtures()[name], directory / f"{name}.gguf")
    target, drafter = sha256(directory / "dense-target.gguf"), sha256(directory / "dflash-drafter.gguf")
    (directory / "manifest.toml").write_text(
        f'schema = "power.manifest/v1"\nname = "dense"\n[target]\npath = "dense-target.gguf"\nsha256 = "{target}"\n'
        f'[[drafters]]\nkind = "dflash"\npath = "dflash-drafter.gguf"\nsha256 = "{drafter}"\n'
        f'target_sha256 = "{target}"\n')
    (directory / "profile.toml").write_text('schema = "power.profile/v1"\nname = "dflash"\nspec_mode = "dflash"\n'
                                            'spec_draft_max = 3\nspec_mtp_recurrent_snapshots = '
                                            '3\n[runtime]\nctx = 128\n')
    plan = directory / "plan.json"
    result = power("plan", directory / "manifest.toml", directory / "profile.toml", "--device", "2 GiB",
                   "--engine", engine, "-o", plan)
    assert result.exit_code == 0, result.output
    return plan


def test_an_untouched_plan_verifies_and_its_receipt_lists_every_artifact(tmp_path):
    plan = fixture_plan(tmp_path)
    verify = power("verify", plan, "--json")
    assert verify.exit_code == 0, verify.output
    report = json.loads(verify.stdout)
    assert report["verified"] is True and report["findings"] == []
    assert [(a["role"], a["verified"]) for a in report["artifacts"]] == [("target", True), ("dflash", True)]
    assert "ok  dflash drafter" in power("verify", plan).stdout

    run = power("run", plan, "--prompt", "Hello", "--max-tokens", "3", "--json")
    assert run.exit_code == 0, run.output
    artifacts = json.loads(run.stdout)["artifacts"]
    assert artifacts == {str(tmp_path / f"{name}.gguf"): sha256(tmp_path / f"{name}.gguf")
                         for name in ("dense-target", "dflash-drafter")}


@pytest.mark.parametrize("other", ["dflash2-drafter", "dflash-drafter-other-tokenizer"])
def test_a_drafter_copied_over_the_planned_one_is_refused_by_run_serve_and_verify(tmp_path, other):
    plan = fixture_plan(tmp_path)
    shutil.copyfile(fixtures()[other], tmp_path / "dflash-drafter.gguf")
    for command in (("run", plan, "--prompt", "Hello", "--max-tokens", "3", "--json"), ("verify", plan, "--json")):
        result = power(*command)
        assert result.exit_code == (2 if command[0] == "run" else 1), result.output
        [finding] = json.loads(result.stdout)["findings"]
        assert finding["code"] == "PWR115" and finding["file"] == str(tmp_path / "dflash-drafter.gguf")
        assert "the dflash drafter" in finding["message"]
    serve = power("serve", plan, "--port", "0")
    assert serve.exit_code == 2 and "PWR115" in serve.output


def test_the_seal_never_takes_a_digest_from_the_cache(tmp_path):
    """Even a cache entry that matches the tampered file's stamp (a stale or forged cache) is not believed."""
    plan = fixture_plan(tmp_path)
    target = tmp_path / "dense-target.gguf"
    planned = sha256(target)
    overwrite_keeping_mtime(target, target.stat().st_size - 64, b"\x7f" * 64)
    cache = tmp_path / "cache" / "digests.json"
    stamp = os.stat(target)
    key = ":".join(str(part) for part in (stamp.st_dev, stamp.st_ino, stamp.st_size, stamp.st_mtime_ns,
                                          stamp.st_ctime_ns))
    cache.write_text(json.dumps({"schema": "power.digest-cache/v2", "entries": {key: {"sha256": planned}}}))
    assert json.loads(power("inspect", "--json", target).stdout)["sha256"] == planned  # the cache speaks here
    run = power("run", plan, "--prompt", "Hello", "--max-tokens", "3", "--json")
    verify = power("verify", plan, "--json")
    assert (run.exit_code, verify.exit_code) == (2, 1)
    assert codes(run) == codes(verify) == ["PWR115"]


def test_render_refuses_a_same_size_edit_and_verify_stays_the_gate(tmp_path):
    """Issue 38 item 6: a same-size edit with its mtime put back does not render (its ctime moved, so the digest
    cache's entry for the file no longer stands for it), nor verify; another size does not render either."""
    plan = fixture_plan(tmp_path)
    target = tmp_path / "dense-target.gguf"
    assert power("render", plan, "--target", "llama-server").exit_code == 0  # hashed, and cached
    overwrite_keeping_mtime(target, target.stat().st_size - 64, b"\x7f" * 64)
    edited = power("render", plan, "--target", "llama-server")
    assert edited.exit_code == 2 and "PWR115" in edited.stderr and edited.stdout == ""
    assert power("verify", plan).exit_code == 1
    with target.open("ab") as grown:
        grown.write(b"\0")
    grown_render = power("render", plan, "--target", "llama-server")
    assert grown_render.exit_code == 2 and "PWR115" in grown_render.stderr and grown_render.stdout == ""


def test_render_refuses_a_target_path_edited_to_another_file(tmp_path):
    plan = fixture_plan(tmp_path)
    document = json.loads(plan.read_text())
    document["target"]["path"] = "/etc/passwd"
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(document))  # paths are outside the digest: the seal still holds
    result = power("render", edited, "--target", "llama-server")
    assert result.exit_code == 2 and result.stdout == ""
    assert "/etc/passwd: PWR115" in result.stderr and "the target is" in result.stderr
    out = tmp_path / "launch.sh"
    assert power("render", edited, "--target", "llama-server", "-o", out).exit_code == 2 and not out.exists()
    assert power("verify", edited).exit_code == 1
    rendered = power("render", plan, "--target", "llama-server")
    assert rendered.exit_code == 0 and f"-m {tmp_path / 'dense-target.gguf'}" in rendered.stdout


def test_a_drafter_path_edited_to_the_target_is_refused(tmp_path):
    plan = fixture_plan(tmp_path)
    document = json.loads(plan.read_text())
    document["drafters"][0]["path"] = document["target"]["path"]
    plan.write_text(json.dumps(document))
    for command, code in (("verify", 1), ("run", 2)):
        result = power(command, plan, *(["--prompt", "x"] if command == "run" else []), "--json")
        assert result.exit_code == code and codes(result) == ["PWR115"]


def test_verify_finds_artifacts_under_root_by_file_name(tmp_path):
    (tmp_path / "build").mkdir()
    fixture_plan(tmp_path / "build", engine="power")
    mounted = tmp_path / "models"
    (tmp_path / "build").rename(mounted)
    moved_plan = mounted / "plan.json"
    absolute = power("verify", moved_plan, "--json")  # the plan names the files where they were planned
    assert absolute.exit_code == 1 and codes(absolute) == ["PWR110", "PWR110"]
    assert power("verify", moved_plan, "--root", mounted).exit_code == 0
    rendered = power("render", moved_plan, "--target", "power", "--root", mounted)
    assert rendered.exit_code == 0 and rendered.stdout.rstrip().endswith(f"--root {mounted}")
    run = power("run", moved_plan, "--root", mounted, "--prompt", "Hello", "--max-tokens", "2", "--json")
    assert run.exit_code == 0 and str(mounted / "dflash-drafter.gguf") in json.loads(run.stdout)["artifacts"]


def test_verify_relative_paths_resolve_against_the_plans_folder(tmp_path, monkeypatch):
    plan = fixture_plan(tmp_path)
    document = json.loads(plan.read_text())
    document["target"]["path"], document["drafters"][0]["path"] = "dense-target.gguf", "dflash-drafter.gguf"
    plan.write_text(json.dumps(document))
    monkeypatch.chdir("/")
    assert power("verify", plan).exit_code == 0


def test_verify_reports_a_broken_seal_and_refuses_what_is_not_a_plan(tmp_path):
    plan = fixture_plan(tmp_path)
    edited = tmp_path / "edited.json"
    edited.write_text(plan.read_text().replace('"k": 3', '"k": 4'))
    broken = power("verify", edited, "--json")
    assert broken.exit_code == 1 and codes(broken) == ["PWR082"] and json.loads(broken.stdout)["verified"] is False
    (tmp_path / "junk.json").write_text("{not json")
    assert power("verify", tmp_path / "junk.json").exit_code == 2
    assert power("verify", tmp_path / "missing.json").exit_code == 2
    assert power("verify").exit_code == 2


def _forged(plan_path: Path, **drafter_changes) -> Path:
    """A plan re-sealed by hand (its digest recomputed), as only someone who can write the plan file could."""
    plan = load_plan(plan_path)
    drafter = plan.drafters[0].model_copy(update=drafter_changes)
    forged = ResolvedPlan.build(**{**dict(plan), "drafters": (drafter,), "digest": ""})
    path = plan_path.with_name("forged.json")
    save_plan(forged, path)
    return path


def test_verify_checks_the_drafters_tokenizer_and_binding_itself(tmp_path):
    plan = fixture_plan(tmp_path)
    other = tmp_path / "other.gguf"
    shutil.copyfile(fixtures()["dflash-drafter-other-tokenizer"], other)
    mismatch = power("verify", _forged(plan, path=str(other), sha256=sha256(other), size=other.stat().st_size),
                     "--json")
    assert mismatch.exit_code == 1 and codes(mismatch) == ["PWR310"]
    unbound = power("verify", _forged(plan, target_sha256="ab" * 32), "--json")
    assert unbound.exit_code == 1 and codes(unbound) == ["PWR213"]


def test_verify_starts_without_torch():
    probe = "import sys; import power.app.commands.verify; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe]).returncode == 0


def test_run_never_decodes_bytes_other_than_those_it_verified(tmp_path, monkeypatch):
    """Whoever can write the model rewrites `output_norm.weight` the moment its sha256 is known (the window between
    check and load): the run holds no copy of the file (issue 40.2), so each tensor read into place is checked
    against the verifying read's digest of it, and the changed one is refused (PWR116), never decoded."""
    from power.artifacts.gguf_reader import read_header

    model = tmp_path / "gemma.gguf"
    shutil.copyfile(gemma(), model)
    plan = gemma_plan(tmp_path, model)
    args = ("run", plan, "--prompt", "The capital of France is", "--max-tokens", "6", "--json")
    header = read_header(model)
    norm = next(t for t in header.tensors if t.name == "output_norm.weight")
    real_sha256 = hashlib.sha256

    class TamperedAfterHashing:
        """sha256 as hashlib computes it; once the model's digest is taken, the file is rewritten."""

        def __init__(self, *args):
            self.inner = real_sha256(*args)

        def update(self, data):
            self.inner.update(data)

        def digest(self):
            return self.inner.digest()

        def hexdigest(self):
            digest = self.inner.hexdigest()
            if digest == GEMMA_SHA256:
                overwrite_keeping_mtime(model, header.data_offset + norm.offset, bytes(norm.nbytes))
            return digest

    monkeypatch.setattr(hashlib, "sha256", TamperedAfterHashing)
    raced = power(*args)
    monkeypatch.undo()
    assert sha256(model) != GEMMA_SHA256  # the file really changed under the run
    assert raced.exit_code == 2 and codes(raced) == ["PWR116"] and "output_norm.weight" in raced.stdout, raced.output


@pytest.mark.parametrize("edit", ["null", "removed"])
def test_a_drafter_whose_path_is_nulled_or_removed_is_not_a_plan(tmp_path, edit):
    """Issue 26 item 6: whether an artifact has a file is sealed; verify, render and run refuse the edit."""
    plan = fixture_plan(tmp_path)
    document = json.loads(plan.read_text())
    if edit == "null":
        document["drafters"][0]["path"] = None
    else:
        del document["drafters"][0]["path"]
    plan.write_text(json.dumps(document))
    verify = power("verify", plan, "--json")
    assert verify.exit_code == 2 and codes(verify) == ["PWR081"]
    assert "must name the file's path" in verify.stdout
    render = power("render", plan, "--target", "llama-server")
    assert render.exit_code == 2 and "PWR081" in render.output
    run = power("run", plan, "--prompt", "Hello", "--max-tokens", "2")
    assert run.exit_code == 2 and "PWR081" in run.output


@pytest.mark.parametrize("edit", ["quoted number", "duplicate key"])
def test_a_type_coerced_or_duplicate_key_edit_breaks_the_seal(tmp_path, edit):
    """Issue 26 (low): `"k": "5"` validates to 5 and a repeated key hides a value, so both kept the digest."""
    plan = fixture_plan(tmp_path)
    text = plan.read_text()
    document = json.loads(text)
    if edit == "quoted number":
        document["speculation"]["k"] = str(document["speculation"]["k"])
        plan.write_text(json.dumps(document))
    else:
        plan.write_text(text.replace('"speculation": {', '"speculation": {"k": 1, ', 1))
    verify = power("verify", plan, "--json")
    assert verify.exit_code == 2 and codes(verify)[0] in ("PWR080", "PWR081"), verify.output
    run = power("run", plan, "--prompt", "Hello", "--max-tokens", "2")
    assert run.exit_code == 2
