"""`power pull` against a loopback server imitating the Hub's endpoints (tests/hub_server.py): no network.

Each refusal leaves nothing where the engine reads (the output folder holds no file of the artifact's name)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hub_server import Hub, serving, sha256

POWER = str(Path(sys.executable).parent / "power")
COMMIT_A = "a" * 40
COMMIT_B = "b" * 40
WEIGHTS = bytes(range(256)) * 4096  # 1 MiB
NEWER = WEIGHTS[::-1]


@pytest.fixture
def hub():
    with serving(Hub()) as hub:
        hub.commit(COMMIT_A, {"model.gguf": WEIGHTS})
        yield hub


def hub_env(hub: Hub, tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "HF_ENDPOINT": hub.base, "HF_HUB_CACHE": str(tmp_path / "hf-cache"), "HF_TOKEN": "hf_test",
            "POWER_CACHE_DIR": str(tmp_path / "power-cache"), "HF_HUB_DISABLE_TELEMETRY": "1"}


def run(hub: Hub, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([POWER, "pull", *args], capture_output=True, text=True, env=hub_env(hub, tmp_path),
                          timeout=120)


def manifest(tmp_path: Path, source: str, data: bytes | None = WEIGHTS, size: int | None = None) -> Path:
    digests = "" if data is None else f'size = {len(data) if size is None else size}\nsha256 = "{sha256(data)}"\n'
    path = tmp_path / "m.toml"
    path.write_text(f'# the test manifest\nschema = "power.manifest/v1"\nname = "pulled"\n[target]\n'
                    f'path = "model.gguf"  # beside the manifest\n{digests}[target.source]\n{source}\n')
    return path


def hub_source(revision: str = COMMIT_A, filename: str = "model.gguf") -> str:
    return f'repo = "o/n"\nrevision = "{revision}"\nfilename = "{filename}"'


def codes(result: subprocess.CompletedProcess) -> list[str]:
    return [finding["code"] for finding in json.loads(result.stdout)["findings"]]


def test_a_clean_pull_places_the_verified_file_and_a_second_pull_downloads_nothing(hub, tmp_path):
    out = tmp_path / "models"
    first = run(hub, tmp_path, str(manifest(tmp_path, hub_source())), "-o", str(out))
    assert first.returncode == 0, first.stderr
    assert (out / "model.gguf").read_bytes() == WEIGHTS
    assert f"pulled from hf://o/n@{COMMIT_A}/model.gguf" in first.stdout
    assert all(auth == "Bearer hf_test" for *_, auth in hub.requests)  # HF_TOKEN, as huggingface_hub sends it
    assert not (out / ".power-pull").exists()
    gets = len(hub.gets())
    second = run(hub, tmp_path, str(manifest(tmp_path, hub_source())), "-o", str(out), "--json")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["artifacts"][0]["fetched"] is False
    assert len(hub.gets()) == gets


def test_without_an_output_folder_the_file_goes_to_the_manifest_path(hub, tmp_path):
    assert run(hub, tmp_path, str(manifest(tmp_path, hub_source()))).returncode == 0
    assert (tmp_path / "model.gguf").read_bytes() == WEIGHTS


def test_a_tampered_byte_is_refused_deleted_and_named_with_both_digests(hub, tmp_path):
    tampered = bytearray(WEIGHTS)
    tampered[1000] ^= 1
    hub.served["model.gguf"] = bytes(tampered)
    result = run(hub, tmp_path, str(manifest(tmp_path, hub_source())), "-o", str(tmp_path / "models"), "--json")
    assert result.returncode == 1 and codes(result) == ["PWR136"]
    message = json.loads(result.stdout)["findings"][0]["message"]
    assert sha256(WEIGHTS) in message and sha256(bytes(tampered)) in message and "model.gguf" in message
    assert not (tmp_path / "models" / "model.gguf").exists()
    assert not [p for p in (tmp_path / "hf-cache").rglob("*") if p.is_file() and p.stat().st_size == len(WEIGHTS)]


def test_a_wrong_size_is_refused_before_anything_is_placed(hub, tmp_path):
    result = run(hub, tmp_path, str(manifest(tmp_path, hub_source(), size=len(WEIGHTS) + 1)), "--json")
    assert result.returncode == 1 and codes(result) == ["PWR135"]
    assert not (tmp_path / "model.gguf").exists()


def test_the_hubs_own_sha256_disagreeing_with_the_manifest_is_refused(hub, tmp_path):
    hub.commit(COMMIT_B, {"model.gguf": NEWER}, branch="main")
    result = run(hub, tmp_path, str(manifest(tmp_path, hub_source(COMMIT_B))), "--json")
    assert result.returncode == 1 and codes(result) == ["PWR137"] and not hub.gets()


def test_a_truncated_body_leaves_a_partial_that_the_next_pull_resumes(hub, tmp_path):
    hub.files["model.gguf"] = WEIGHTS
    hub.cut_at["model.gguf"] = 300_000
    path = manifest(tmp_path, f'url = "{hub.base}/files/model.gguf"')
    out = tmp_path / "models"
    cut = run(hub, tmp_path, str(path), "-o", str(out), "--json")
    assert cut.returncode == 1 and codes(cut) == ["PWR134"]
    assert not (out / "model.gguf").exists()
    assert (out / ".power-pull" / "model.gguf.partial").stat().st_size == 300_000
    del hub.cut_at["model.gguf"]
    hub.body_bytes = 0
    resumed = run(hub, tmp_path, str(path), "-o", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert hub.gets()[-1][2] == "bytes=300000-" and hub.body_bytes == len(WEIGHTS) - 300_000
    assert (out / "model.gguf").read_bytes() == WEIGHTS and not (out / ".power-pull").exists()


def test_a_hub_transfer_cut_short_is_resumed_within_the_run(hub, tmp_path):
    hub.cut_at["model.gguf"] = 300_000
    hub.cut_once.add("model.gguf")
    result = run(hub, tmp_path, str(manifest(tmp_path, hub_source())))
    assert result.returncode == 0, result.stderr
    assert [r[2] for r in hub.gets()] == [None, "bytes=300000-"]
    assert (tmp_path / "model.gguf").read_bytes() == WEIGHTS


def test_a_hub_download_killed_mid_transfer_resumes_in_the_next_pull(hub, tmp_path):
    hub.hold_at["model.gguf"] = 400_000
    path = manifest(tmp_path, hub_source())
    out = tmp_path / "models"
    partial = out / ".power-pull" / "model.gguf.partial"
    killed = subprocess.Popen([POWER, "pull", str(path), "-o", str(out)], env=hub_env(hub, tmp_path),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert hub.holding.wait(timeout=120)
        wait_for(lambda: partial.exists() and partial.stat().st_size == 400_000)
    finally:
        killed.kill()
        killed.wait()
    hub.released.set()
    assert not (out / "model.gguf").exists()
    hub.body_bytes = 0
    resumed = run(hub, tmp_path, str(path), "-o", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert hub.gets()[-1][2:] == ("bytes=400000-", "Bearer hf_test") and hub.body_bytes == len(WEIGHTS) - 400_000
    assert (out / "model.gguf").read_bytes() == WEIGHTS and not partial.parent.exists()


def test_a_file_already_in_the_hub_cache_is_checked_and_placed_without_a_download(hub, tmp_path):
    hf = str(Path(sys.executable).parent / "hf")
    subprocess.run([hf, "download", "o/n", "model.gguf", "--revision", COMMIT_A], check=True, capture_output=True,
                   env=hub_env(hub, tmp_path), timeout=120)
    gets = len(hub.gets())
    result = run(hub, tmp_path, str(manifest(tmp_path, hub_source())), "-o", str(tmp_path / "models"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "models" / "model.gguf").read_bytes() == WEIGHTS and len(hub.gets()) == gets


def wait_for(condition) -> None:
    """Until `condition()` holds (a file another process writes); fails after a minute."""
    for _ in range(600):
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError("the condition never held")


def test_pin_writes_commit_size_and_digest_and_a_moved_branch_changes_nothing(hub, tmp_path):
    path = manifest(tmp_path, hub_source("main"), data=None)
    refused = run(hub, tmp_path, str(path), "--json")
    assert refused.returncode == 1 and sorted(codes(refused)) == ["PWR131", "PWR132"] and not hub.gets()
    pinned = run(hub, tmp_path, str(path), "--pin")
    assert pinned.returncode == 0, pinned.stderr
    text = path.read_text()
    assert f'revision = "{COMMIT_A}"' in text and f'sha256 = "{sha256(WEIGHTS)}"' in text
    assert f"size = {len(WEIGHTS):_}" in text and "# the test manifest" in text and "# beside the manifest" in text
    assert f'+revision = "{COMMIT_A}"' in pinned.stderr and "PWR139" in pinned.stderr
    gets = len(hub.gets())
    again = run(hub, tmp_path, str(path))
    assert again.returncode == 0 and "already in place" in again.stdout and len(hub.gets()) == gets
    hub.commit(COMMIT_B, {"model.gguf": NEWER}, branch="main")  # the branch moves on
    elsewhere = run(hub, tmp_path, str(path), "-o", str(tmp_path / "elsewhere"))
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert (tmp_path / "elsewhere" / "model.gguf").read_bytes() == WEIGHTS


@pytest.mark.parametrize("location", ["http://localhost:{port}/files/model.gguf", "https://127.0.0.1:{port}/x"])
def test_a_redirect_to_another_host_or_scheme_is_not_followed(hub, tmp_path, location):
    port = hub.base.rsplit(":", 1)[1]
    hub.redirect["model.gguf"] = location.format(port=port)
    for source in (hub_source(), f'url = "{hub.base}/files/model.gguf"'):
        hub.files["model.gguf"] = WEIGHTS
        result = run(hub, tmp_path, str(manifest(tmp_path, source)), "--json")
        assert result.returncode == 1 and codes(result) == ["PWR138"], result.stderr
        assert not (tmp_path / "model.gguf").exists()


def test_an_unknown_file_is_named(hub, tmp_path):
    result = run(hub, tmp_path, str(manifest(tmp_path, hub_source(filename="missing.gguf"))), "--json")
    assert result.returncode == 1 and codes(result) == ["PWR134"]
    assert "no file 'missing.gguf'" in json.loads(result.stdout)["findings"][0]["message"]


def test_an_artifact_missing_with_no_source_is_refused(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(f'schema = "power.manifest/v1"\nname = "x"\n[target]\npath = "t.gguf"\nsha256 = "{"0" * 64}"\n')
    result = subprocess.run([POWER, "pull", str(path), "--json"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and codes(result) == ["PWR140"]


def test_usage_errors_exit_2(tmp_path):
    missing = subprocess.run([POWER, "pull", str(tmp_path / "nope.toml")], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "PWR001" in missing.stderr
    plan = tmp_path / "plan.json"
    plan.write_text("{not json")
    broken = subprocess.run([POWER, "pull", str(plan)], capture_output=True, text=True, timeout=120)
    assert broken.returncode == 2 and "PWR080" in broken.stderr
