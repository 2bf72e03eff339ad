"""The CPU kernel cache as a user meets it: `power kernels build|status`, and `power run` on a cache that is
missing, half-built, locked, tampered with or in the way. Each run is a fresh process with its own cache."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gguf_helpers import fixtures

from power.kernels.cpu import build as kernel_build
from power.kernels.cpu import cache

PATH = "scalar"  # every CPU runs it; the tests force it so their cache holds one small build
POWER = [str(Path(sys.executable).parent / "power")]


def power(*args: str, cache_root: Path, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, cache.CACHE_ENV: str(cache_root), kernel_build.ENV_PATH: PATH, **env}
    return subprocess.run([*POWER, *args], env=environment, capture_output=True, text=True, timeout=timeout)


def run_dense(cache_root: Path, **env: str) -> subprocess.CompletedProcess:
    return power("run", "--gguf", str(fixtures()["dense-target"]), "--prompt", "The quick brown fox",
                 "--max-tokens", "2", "--json", cache_root=cache_root, **env)


def key() -> str:
    return kernel_build.build_key(PATH)


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory) -> Path:
    """A cache holding this installation's scalar build (copied from the default cache, built there if missing)."""
    default = tmp_path_factory.mktemp("kernels")
    os.environ.pop(cache.CACHE_ENV, None)
    kernel_build.build(PATH)
    shutil.copytree(cache.folder_of(PATH, key()), default / f"{PATH}-{key()}")
    os.chmod(default, 0o700)
    return default


@pytest.fixture
def cache_copy(prebuilt, tmp_path) -> Path:
    root = tmp_path / "kernels"
    shutil.copytree(prebuilt, root)
    return root


def library(root: Path) -> Path:
    return root / f"{PATH}-{key()}" / cache.library_name(kernel_build.namespace_of(PATH), key())


def finding(done: subprocess.CompletedProcess, code: str) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"{code} [error]" in done.stderr, done.stderr[-3000:]
    return done.stderr


def test_a_prebuilt_cache_runs_without_a_compiler_and_status_says_built(cache_copy):
    no_compiler = {"CXX": "/nonexistent/c++", "PATH": str(Path(sys.executable).parent)}
    done = run_dense(cache_copy, **no_compiler)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "compiling" not in done.stderr
    assert json.loads(done.stdout)["runtime"]["instruction_path"].startswith(PATH)
    status = power("kernels", "status", "--json", cache_root=cache_copy)
    assert status.returncode == 0, status.stderr
    rows = {row["path"]: row for row in json.loads(status.stdout)["paths"]}
    assert rows[PATH]["built"] and rows[PATH]["chosen"] and rows[PATH]["runs_here"]


def test_status_of_an_empty_cache_says_not_built_and_exits_1(tmp_path):
    status = power("kernels", "status", cache_root=tmp_path / "kernels")
    assert status.returncode == 1
    assert "not built" in status.stdout and "`power kernels build` compiles them now" in status.stderr


def test_a_truncated_library_is_refused_not_loaded(cache_copy):
    so = library(cache_copy)
    so.write_bytes(so.read_bytes()[: so.stat().st_size // 2])  # a SIGBUS when mapped and run, before the digest
    stderr = finding(run_dense(cache_copy), "PWR621")
    assert "is not the one this installation built" in stderr and f"power kernels build --path {PATH} --force" in stderr


def test_a_planted_library_is_refused_and_its_constructor_never_runs(cache_copy, tmp_path):
    marker = tmp_path / "constructor-ran"
    source = tmp_path / "planted.c"
    source.write_text('#include <stdio.h>\n__attribute__((constructor)) static void planted(void) '
                      f'{{ FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\n')
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the planted library")
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library(cache_copy)), str(source)], check=True)
    stderr = finding(run_dense(cache_copy), "PWR621")
    assert "is not the one this installation built" in stderr
    assert not marker.exists()


def test_a_library_others_can_write_is_refused(cache_copy):
    os.chmod(library(cache_copy).parent, 0o777)
    stderr = finding(run_dense(cache_copy), "PWR621")
    assert "can be written by others (mode 0777)" in stderr and "chmod go-w" in stderr


def test_a_library_that_cannot_load_is_a_finding(cache_copy):
    so = library(cache_copy)
    so.write_bytes(b"not an ELF file at all\n" * 64)
    record_path = so.parent / cache.RECORD
    record = json.loads(record_path.read_text())
    digest, size = cache._hash_fd(os.open(so, os.O_RDONLY))
    record_path.write_text(json.dumps(record | {"sha256": digest, "bytes": size}))
    stderr = finding(run_dense(cache_copy), "PWR622")
    assert "does not load" in stderr


def test_a_cache_path_that_is_not_a_folder_is_a_finding(tmp_path):
    in_the_way = tmp_path / "kernels"
    in_the_way.write_text("a file where the kernel cache should be\n")
    stderr = finding(run_dense(in_the_way), "PWR620")
    assert f"{in_the_way} is not a folder" in stderr and "POWER_KERNEL_CACHE" in stderr


def test_an_unknown_instruction_path_is_a_finding(cache_copy):
    stderr = finding(run_dense(cache_copy, POWER_CPU_PATH="sve"), "PWR624")
    assert "'sve' (POWER_CPU_PATH) is not an instruction path" in stderr


def test_a_build_lock_held_by_a_live_build_is_waited_for_within_the_bound(tmp_path):
    root = tmp_path / "kernels"
    root.mkdir(mode=0o700)
    with open(root / f".{PATH}-{key()}.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        started = time.monotonic()
        done = power("kernels", "build", cache_root=root, POWER_KERNEL_BUILD_WAIT="2")
    assert time.monotonic() - started < 60
    stderr = finding(done, "PWR623")
    assert "another process is building the scalar CPU kernels; waiting for it (at most 2 s" in stderr
    assert "gave up waiting" in stderr


@pytest.mark.slow  # two builds of the scalar kernels (about 25 s of CPU time each)
def test_a_build_killed_midway_leaves_the_next_start_working(tmp_path):
    """SIGKILL during the first build (the compiler running), then `power run`: it builds and generates, in a
    cache created 0700 even under umask 000, and no private build folder is left behind."""
    root = tmp_path / "kernels"
    environment = {**os.environ, cache.CACHE_ENV: str(root), kernel_build.ENV_PATH: PATH}
    first = subprocess.Popen([*POWER, "kernels", "build"], env=environment, stderr=subprocess.PIPE,
                             preexec_fn=lambda: os.umask(0))
    deadline = time.monotonic() + 300
    while not any(root.glob(f".build-{PATH}-*/build.ninja")):
        assert first.poll() is None and time.monotonic() < deadline, "the build ended before it could be killed"
        time.sleep(0.1)
    time.sleep(1)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert not (root / f"{PATH}-{key()}").exists()
    done = subprocess.run([*POWER, "run", "--gguf", str(fixtures()["dense-target"]), "--prompt", "The quick brown fox",
                           "--max-tokens", "2", "--json"], env=environment, capture_output=True, text=True,
                          timeout=600, preexec_fn=lambda: os.umask(0))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "compiling the scalar CPU kernels" in done.stderr
    assert not list(root.glob(".build-*"))
    for path in (root, library(root).parent):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    for path in (library(root), library(root).parent / cache.RECORD):
        assert not path.stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def test_a_read_only_cache_without_this_path_says_how_to_get_it():
    """A container image's cache is read-only: a path it lacks cannot be compiled there. /sys stands in for it
    (root's, 0555, and no one may create files in it, root included)."""
    stderr = finding(power("kernels", "build", cache_root=Path("/sys")), "PWR620")
    assert f"the {PATH} CPU kernels are not built and cannot be built into /sys" in stderr
    assert "POWER_CPU_PATH to a path this cache holds" in stderr
