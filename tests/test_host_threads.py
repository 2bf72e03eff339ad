"""Threads and waiting on a real host: `power run` sizes its threads to the process's affinity and cgroup CPU
quota, sets a yielding OpenMP wait policy and its kernel threads' adaptive wait unless the user chose others, and
its receipt says all of them and why."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from gguf_helpers import fixtures

from power.threads import cgroup_quota

POWER = str(Path(sys.executable).parent / "power")
CLEAN = {name: value for name, value in os.environ.items()
         if name not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "POWER_KERNEL_WAIT")}
REPO = Path(__file__).resolve().parents[1]
GEMMA = REPO / "models" / "gemma-3-270m-q4_k_m.gguf"


def run_power(env: dict[str, str] | None = None, preexec_fn=None, *args: str, gguf: Path | None = None,
              tokens: int = 2) -> subprocess.CompletedProcess:
    return subprocess.run([POWER, "run", "--gguf", str(gguf or fixtures()["dense-target"]), "--prompt",
                           "The quick brown fox", "--max-tokens", str(tokens), "--json", *args], env=env or CLEAN,
                           capture_output=True, text=True,
                          timeout=600, preexec_fn=preexec_fn)


def receipt(env: dict[str, str] | None = None, preexec_fn=None, *args: str, **options) -> dict:
    done = run_power(env, preexec_fn, *args, **options)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def receipt_runtime(env: dict[str, str] | None = None, preexec_fn=None, *args: str) -> dict:
    return receipt(env, preexec_fn, *args)["runtime"]


def test_power_sets_a_passive_wait_unless_the_user_chose_a_wait_policy():
    assert (
        receipt_runtime()["wait_policy"] == "OMP_WAIT_POLICY=passive (set by Power: torch's idle OpenMP threads sleep)"
    )
    chosen = receipt_runtime(CLEAN | {"OMP_WAIT_POLICY": "active"})
    assert chosen["wait_policy"] == "OMP_WAIT_POLICY=active (from the environment)"
    spin = receipt_runtime(CLEAN | {"GOMP_SPINCOUNT": "0"})
    assert spin["wait_policy"] == "GOMP_SPINCOUNT=0 (from the environment)"


def test_kernel_threads_wait_adaptively_unless_the_environment_chose():
    assert receipt_runtime()["kernel_wait"] == ("adaptive: idle kernel threads spin up to 200 us while the host is "
                                                "quiet, sleep at once while it is contended (set by Power)")
    chosen = receipt_runtime(CLEAN | {"POWER_KERNEL_WAIT": "sleep"})
    assert chosen["kernel_wait"] == "sleep: idle kernel threads sleep at once (POWER_KERNEL_WAIT from the environment)"


def test_an_unknown_kernel_wait_is_refused_before_the_load():
    done = run_power(CLEAN | {"POWER_KERNEL_WAIT": "busy"})
    assert done.returncode != 0
    assert "PWR652" in done.stderr and "POWER_KERNEL_WAIT='busy'" in done.stderr, done.stderr[-3000:]
    assert "sleep, spin, adaptive" in done.stderr


def test_the_bundled_model_decodes_the_same_tokens_at_one_and_two_threads_under_every_kernel_wait():
    """The kernel threads take chunks of a product in turn, so which thread computes a row changes with timing:
    its result must not."""
    def tokens(wait: str, threads: int) -> list[int]:
        return receipt(CLEAN | {"POWER_KERNEL_WAIT": wait}, None, "--threads", str(threads), gguf=GEMMA,
                       tokens=12)["token_ids"]

    alone = tokens("sleep", 1)
    assert len(alone) == 12
    for wait in ("sleep", "spin", "adaptive"):
        assert tokens(wait, 2) == alone, wait


def test_the_policy_is_in_place_before_torch_loads_and_a_late_import_is_reported():
    program = ("import os, sys; import power; assert 'torch' not in sys.modules; import torch; "
               "print(os.environ['OMP_WAIT_POLICY'])")
    done = subprocess.run([sys.executable, "-c", program], env=CLEAN, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "passive", done.stderr
    late = "import torch, power.threads as t; print(t.settle_wait_policy().describe())"
    done = subprocess.run([sys.executable, "-c", late], env=CLEAN, capture_output=True, text=True, timeout=300)
    assert "torch was loaded before Power could set a wait policy" in done.stdout, done.stderr


def _first_import(tree: ast.Module) -> str:
    """The module a script imports first, after `from __future__`."""
    for statement in tree.body:
        if isinstance(statement, ast.Import):
            return statement.names[0].name
        if isinstance(statement, ast.ImportFrom) and statement.module != "__future__":
            return statement.module or ""
    return ""


@pytest.mark.parametrize("script", sorted((REPO / "bench").glob("*.py")), ids=lambda path: path.name)
def test_a_bench_sets_the_wait_policy_before_torch_loads(script: Path):
    """A bench that loads torch first measures libgomp's spinning idle threads, which `power run` never has: each
    took the CPU from the next round's products after a speculative round's torch operations (docs/drafters.md)."""
    tree = ast.parse(script.read_text())
    loads_torch = any(isinstance(node, ast.Import) and any(alias.name == "torch" for alias in node.names)
                      for node in ast.walk(tree))
    if loads_torch and '__name__ == "__main__"' in script.read_text():
        assert _first_import(tree).split(".")[0] == "power", f"{script.name} must import power before torch"


def test_threads_follow_the_affinity_mask_and_an_explicit_count_wins():
    one_cpu = sorted(os.sched_getaffinity(0))[:1]
    pinned = receipt_runtime(CLEAN, lambda: os.sched_setaffinity(0, one_cpu))
    assert pinned["threads"] == 1 and pinned["threads_why"].startswith("1 CPUs in this process's affinity")
    asked = receipt_runtime(CLEAN, None, "--threads", "3")
    assert asked["threads"] == 3 and asked["threads_why"] == "--threads 3"


def _cpu_cgroup() -> Path | None:
    """A fresh cgroup with a CPU quota of half a CPU, when this process may create one (v2, else v1's cpu)."""
    name = f"power-test-{uuid.uuid4().hex[:8]}"
    for parent, quota_file, quota in ((Path("/sys/fs/cgroup"), "cpu.max", "50000 100000"),
                                      (Path("/sys/fs/cgroup/cpu"), "cpu.cfs_quota_us", "50000")):
        if not (parent / "cgroup.procs").exists() or not os.access(parent, os.W_OK):
            continue
        if parent.name == "cgroup" and "cpu" not in (parent / "cgroup.subtree_control").read_text().split():
            continue
        folder = parent / name
        try:
            folder.mkdir()
            (folder / quota_file).write_text(quota)
        except OSError:
            continue
        return folder
    return None


def test_threads_are_capped_by_the_cgroup_cpu_quota():
    """Issue 35 item 1: a pod limited to a fraction of a node's CPUs runs that many threads (rounded up)."""
    folder = _cpu_cgroup()
    if folder is None:
        pytest.skip("this process cannot create a cgroup with a CPU quota (not root, or no cpu controller)")
    try:
        runtime = receipt_runtime(CLEAN, lambda: (folder / "cgroup.procs").write_text(str(os.getpid())))
    finally:
        folder.rmdir()
    assert runtime["threads"] == 1
    assert "a cgroup quota of 0.5 CPUs" in runtime["threads_why"] and str(folder) in runtime["threads_why"]


def test_the_quota_is_the_smallest_along_the_cgroups_ancestors(tmp_path):
    """cgroup v2 and v1 layouts as the kernel writes them (Documentation/admin-guide/cgroup-v2.rst, cpu.max;
    v1 cfs_quota_us of -1 for none), read from a copy of their files."""
    v2 = tmp_path / "v2"
    (v2 / "kubepods" / "pod1").mkdir(parents=True)
    (v2 / "cpu.max").write_text("max 100000\n")
    (v2 / "kubepods" / "cpu.max").write_text("200000 100000\n")
    (v2 / "kubepods" / "pod1" / "cpu.max").write_text("max 100000\n")
    assert cgroup_quota(v2, "0::/kubepods/pod1\n") == (2.0, str(v2 / "kubepods" / "cpu.max"))
    assert cgroup_quota(v2, "0::/\n") == (None, None)
    v1 = tmp_path / "v1"
    (v1 / "cpu,cpuacct" / "docker" / "abc").mkdir(parents=True)
    (v1 / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us").write_text("150000\n")
    (v1 / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_period_us").write_text("100000\n")
    (v1 / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu,cpuacct" / "cpu.cfs_period_us").write_text("100000\n")
    quota, where = cgroup_quota(v1, "4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n")
    assert quota == 1.5 and where == str(v1 / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us")


def test_an_engine_power_starts_keeps_its_own_wait_policy_unless_the_user_set_one():
    """llama-server's CPU backend may use OpenMP too: Power's choice for itself is not passed on to it."""
    program = ("import power; from power.threads import environment_for_other_programs as e; "
               "print('OMP_WAIT_POLICY' in e())")
    ours = subprocess.run([sys.executable, "-c", program], env=CLEAN, capture_output=True, text=True, timeout=300)
    assert ours.stdout.strip() == "False", ours.stderr
    users = subprocess.run([sys.executable, "-c", program], env=CLEAN | {"OMP_WAIT_POLICY": "active"},
                           capture_output=True, text=True, timeout=300)
    assert users.stdout.strip() == "True", users.stderr
