"""The seal, through the CLI: an artifact that changed after planning never runs, renders or verifies.

The cache may only speed up what reads artifacts before a plan exists; where a plan
is launched, rendered or verified every artifact is hashed in full.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from gguf_helpers import gemma

from power.orchestrator.cli import main

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


def gemma_plan(directory: Path, model: Path) -> Path:
    manifest = directory / "gemma.manifest.toml"
    manifest.write_text(f'schema = "power.manifest/v1"\nname = "gemma"\n[target]\npath = "{model.name}"\n'
                        f'sha256 = "{GEMMA_SHA256}"\n')
    profile = directory / "plain.profile.toml"
    profile.write_text('schema = "power.profile/v1"\nname = "plain"\nspec_mode = "none"\n[runtime]\nctx = 256\n')
    plan = directory / "plan.json"
    result = power("plan", manifest, profile, "--device", "4 GiB", "-o", plan)
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
