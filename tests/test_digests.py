"""Streaming sha256 and its digest cache, on real files in temp dirs."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from power.artifacts.digests import CHUNK_BYTES, cache_path, sha256_file
from power.artifacts.gguf_reader import ArtifactError


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POWER_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def artifact(tmp_path):
    path = tmp_path / "artifact.bin"
    path.write_bytes(os.urandom(3 * CHUNK_BYTES // 2 + 17))
    return path


def _entries() -> dict:
    return json.loads(cache_path().read_text())["entries"]


def test_matches_hashlib_across_chunk_boundaries(artifact):
    assert sha256_file(artifact, use_cache=False) == hashlib.sha256(artifact.read_bytes()).hexdigest()


def test_empty_file(tmp_path):
    (tmp_path / "empty").write_bytes(b"")
    assert sha256_file(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()


def test_the_cache_answers_for_an_unchanged_file(artifact):
    digest = sha256_file(artifact)
    [(key, entry)] = _entries().items()
    stat = artifact.stat()
    assert key == f"{stat.st_dev}:{stat.st_ino}:{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ctime_ns}"
    assert entry["sha256"] == digest
    # Prove the answer comes from the cache: plant another digest under the same key.
    planted = "0" * 64
    cache_path().write_text(json.dumps({"schema": "power.digest-cache/v2", "entries": {key: {"sha256": planted}}}))
    assert sha256_file(artifact) == planted
    assert sha256_file(artifact, use_cache=False) == digest


def test_an_in_place_change_with_the_old_mtime_set_back_is_hashed_again(artifact):
    first = sha256_file(artifact)
    before = artifact.stat()
    with open(artifact, "r+b") as handle:
        handle.write(b"tampered")
    os.utime(artifact, ns=(before.st_atime_ns, before.st_mtime_ns))  # `touch -d`: the ctime moves on regardless
    assert artifact.stat().st_mtime_ns == before.st_mtime_ns
    assert sha256_file(artifact) == hashlib.sha256(artifact.read_bytes()).hexdigest() != first


def test_a_full_hash_ignores_the_cache_and_refreshes_it(artifact):
    sha256_file(artifact)
    [key] = _entries()
    cache_path().write_text(json.dumps({"schema": "power.digest-cache/v2", "entries": {key: {"sha256": "0" * 64}}}))
    actual = hashlib.sha256(artifact.read_bytes()).hexdigest()
    assert sha256_file(artifact, use_cache=False) == actual
    assert _entries()[key]["sha256"] == actual


def test_a_changed_file_is_hashed_again(artifact):
    first = sha256_file(artifact)
    artifact.write_bytes(b"different")
    assert sha256_file(artifact) == hashlib.sha256(b"different").hexdigest() != first
    assert len(_entries()) == 2


@pytest.mark.parametrize("garbage", ["{not json", "[]", '{"schema": "other", "entries": {}}',
                                     '{"schema": "power.digest-cache/v1", "entries": {"x": "y"}}'])
def test_a_corrupt_cache_is_ignored_and_rebuilt(artifact, garbage):
    cache_path().parent.mkdir(parents=True)
    cache_path().write_text(garbage)
    assert sha256_file(artifact) == hashlib.sha256(artifact.read_bytes()).hexdigest()
    assert list(_entries().values())[-1]["sha256"] == hashlib.sha256(artifact.read_bytes()).hexdigest()


def test_a_cached_value_that_is_not_a_digest_is_not_trusted(artifact):
    sha256_file(artifact)
    [key] = _entries()
    cache_path().write_text(json.dumps({"schema": "power.digest-cache/v2", "entries": {key: {"sha256": "../../etc"}}}))
    assert sha256_file(artifact) == hashlib.sha256(artifact.read_bytes()).hexdigest()


def test_the_cache_is_written_atomically(artifact):
    sha256_file(artifact)
    assert sorted(p.name for p in cache_path().parent.iterdir()) == ["digests.json"]


def test_progress_callback_sees_every_byte(artifact):
    seen = []
    sha256_file(artifact, use_cache=False, progress=seen.append)
    assert sum(seen) == artifact.stat().st_size and len(seen) == 2


def test_a_file_that_shrinks_while_hashed(artifact):
    def truncate_after_first_chunk(_n: int) -> None:
        if artifact.stat().st_size > CHUNK_BYTES:
            os.truncate(artifact, CHUNK_BYTES + 5)

    with pytest.raises(ArtifactError) as raised:
        sha256_file(artifact, use_cache=False, progress=truncate_after_first_chunk)
    finding = raised.value.finding
    assert (
        finding.code == "PWR116" and finding.file == str(artifact) and "changed while it was hashed" in finding.message
    )
    assert not cache_path().exists()


def test_a_file_that_grows_while_hashed(artifact):
    with pytest.raises(ArtifactError) as raised:
        sha256_file(artifact, use_cache=False, progress=lambda _n: artifact.open("ab").write(b"x"))
    assert raised.value.finding.code == "PWR116"


def test_directories_and_fifos_are_refused(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    for path, word in ((tmp_path, "directory"), (tmp_path / "pipe", "FIFO")):
        with pytest.raises(ArtifactError) as raised:
            sha256_file(path)
        assert raised.value.finding.code == "PWR101" and word in raised.value.finding.message


def test_an_unwritable_cache_directory_is_not_an_error(artifact, tmp_path, monkeypatch):
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("")
    monkeypatch.setenv("POWER_CACHE_DIR", str(blocker))
    assert sha256_file(artifact) == hashlib.sha256(artifact.read_bytes()).hexdigest()
