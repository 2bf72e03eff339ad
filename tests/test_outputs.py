"""Every command's output option, pointed where nothing can be written: refused before the work (exit 2, PWR018),
nothing written, no traceback."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from plan_helpers import write_manifest, write_profile

from power.app.cli import main

GOLDEN_PLAN = Path(__file__).parent / "golden" / "render" / "dspark-ngram.plan.json"
FLEET = '''schema = "power.fleet/v1"
name = "lab"
[[hosts]]
name = "a"
devices = [{ model = "x", vram = "24 GiB" }]
'''
# (where the output points, what the finding says)
UNWRITABLE = {
    "proc": ("/proc/out.json", "cannot write in /proc"),
    "no-folder": ("{tmp}/no-such-folder/out.json", "does not exist"),
    "directory": ("{tmp}", "is a directory"),
    "device": ("/dev/null", "not a regular file"),
}


def invoke(*args):
    result = CliRunner().invoke(main, [str(arg) for arg in args])
    assert "Traceback" not in result.output and isinstance(result.exception, (SystemExit, type(None))), result.output
    return result


def refused(result, needle: str) -> None:
    assert result.exit_code == 2, result.output
    assert "PWR018" in result.stderr and needle in result.stderr, result.stderr


def fleet_file(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    return path


@pytest.mark.parametrize("case", UNWRITABLE)
def test_plan_refuses_before_compiling(tmp_path, case):
    out, needle = UNWRITABLE[case]
    manifest, profile = write_manifest(tmp_path, "dense-target", [{"kind": "ngram"}]), write_profile(tmp_path, "ngram")
    result = invoke("plan", manifest, profile, "--device", "24 GiB", "-o", out.format(tmp=tmp_path))
    refused(result, needle)
    assert result.stdout == "" and not (tmp_path / "no-such-folder").exists()


@pytest.mark.parametrize("case", UNWRITABLE)
def test_render_refuses(tmp_path, case):
    out, needle = UNWRITABLE[case]
    refused(invoke("render", GOLDEN_PLAN, "--target", "power", "-o", out.format(tmp=tmp_path)), needle)


@pytest.mark.parametrize("case", ["proc", "no-folder"])
def test_run_refuses_before_generating(tmp_path, case):
    out, needle = UNWRITABLE[case]
    result = invoke("run", GOLDEN_PLAN, "--prompt", "hi", "--receipt", out.format(tmp=tmp_path))
    refused(result, needle)
    assert result.stdout == ""  # nothing was generated, so nothing is lost


@pytest.mark.parametrize("case", ["proc", "no-folder"])
def test_bench_refuses_before_measuring(tmp_path, case):
    out, needle = UNWRITABLE[case]
    refused(invoke("bench", GOLDEN_PLAN, "-o", out.format(tmp=tmp_path)), needle)
    refused(invoke("bench", GOLDEN_PLAN, "--report", out.format(tmp=tmp_path).replace(".json", ".md")), needle)


def test_fleet_review_refuses_a_lock_it_cannot_write_before_reviewing(tmp_path):
    result = invoke("fleet", "review", fleet_file(tmp_path), "--write-lock", "--lock", tmp_path / "nodir" / "x.lock")
    refused(result, "does not exist")
    assert not (tmp_path / "nodir").exists() and "deployments" not in result.stdout


def test_fleet_report_and_rollout_refuse(tmp_path):
    fleet = fleet_file(tmp_path)
    refused(invoke("fleet", "report", fleet, "-o", "/proc/report.html"), "cannot write in /proc")
    refused(invoke("rollout", "status", fleet, "--export-plans", "/proc/power-test"), "cannot write in /proc")
    for command in ("advance", "rollback"):
        refused(invoke("rollout", command, fleet, "--lock", tmp_path / "nodir" / "x.lock"), "does not exist")


@pytest.mark.parametrize("command", [("fixtures", "build"), ("import", "llama-server", "-o")])
def test_directory_outputs_refuse(tmp_path, command):
    (tmp_path / "file").write_text("")
    args = [*command, "{out}"] + (["--", "llama-server", "-m", "m.gguf"] if command[0] == "import" else [])
    refused(invoke(*["/proc/power-test" if arg == "{out}" else arg for arg in args]), "cannot write in /proc")
    # A file where a directory belongs: click's own check or PWR018, either way a usage error.
    assert invoke(*[str(tmp_path / "file") if arg == "{out}" else arg for arg in args]).exit_code == 2


@pytest.fixture
def umask():
    """Set the process umask for one test; the old one comes back after."""
    previous = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(previous)


@pytest.mark.parametrize(("mask", "plain", "script"), [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750),
                                                       (0o077, 0o600, 0o700)])
def test_written_files_follow_the_umask(tmp_path, umask, mask, plain, script):
    umask(mask)
    manifest, profile = write_manifest(tmp_path, "dense-target", [{"kind": "ngram"}]), write_profile(tmp_path, "ngram")
    assert invoke("plan", manifest, profile, "--device", "24 GiB", "-o", tmp_path / "plan.json").exit_code == 0
    assert invoke("render", tmp_path / "plan.json", "--target", "systemd", "-o", tmp_path / "unit.conf").exit_code == 0
    assert invoke("render", tmp_path / "plan.json", "--target", "power", "-o", tmp_path / "launch.sh").exit_code == 0
    modes = {name: stat.S_IMODE((tmp_path / name).stat().st_mode) for name in ("plan.json", "unit.conf", "launch.sh")}
    assert modes == {"plan.json": plain, "unit.conf": plain, "launch.sh": script}


def test_a_replaced_file_keeps_its_mode(tmp_path, umask):
    umask(0o022)
    out = tmp_path / "plan.json"
    out.write_text("{}")
    out.chmod(0o640)
    manifest, profile = write_manifest(tmp_path, "dense-target", [{"kind": "ngram"}]), write_profile(tmp_path, "ngram")
    assert invoke("plan", manifest, profile, "--device", "24 GiB", "-o", out).exit_code == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o640 and out.read_text() != "{}"
