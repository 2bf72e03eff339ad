"""Every document a command reads (plan, fleet lock, env file, unit, TOML) through the CLI, made hostile.

A FIFO, /dev/zero, bytes that are not UTF-8, JSON or TOML nested 100,000 deep, a 5,000-digit integer: each
is refused with the reader's own finding code and the documented exit code, never a hang or a traceback,
and nothing is written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from hostile_documents import JSON_CASES, TEXT_CASES, TOML_CASES, hostile

from power.app.cli import main

pytestmark = pytest.mark.timeout(120)

FLEET = '''schema = "power.fleet/v1"
name = "lab"
[[hosts]]
name = "a"
devices = [{ model = "x", vram = "24 GiB" }]
'''


def invoke(*args) -> object:
    result = CliRunner().invoke(main, [str(arg) for arg in args])
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def snapshot(path: Path) -> object:
    return path.read_bytes() if path.is_file() and not str(path).startswith("/dev/") else os.stat(path).st_mode


# command -> (argv before the plan, argv after it, the file it would write)
PLAN_COMMANDS = {
    "render": (["render"], ["--target", "env", "-o", "{out}/out.env"], "out.env"),
    "run": (["run"], ["--prompt", "hi", "--receipt", "{out}/receipt.json"], "receipt.json"),
    "serve": (["serve"], ["--port", "0"], None),
    "bench": (["bench"], ["-o", "{out}/evidence.json"], "evidence.json"),
    "worth-it": (["worth-it", "--draft-step", "1ms", "-k", "3", "--incumbent", "10", "--plan"], [], None),
}


@pytest.mark.parametrize("case", [*JSON_CASES, *TOML_CASES])
@pytest.mark.parametrize("command", PLAN_COMMANDS)
def test_a_hostile_plan_is_refused_by_every_command_that_reads_plans(tmp_path, command, case):
    plan = hostile(tmp_path, case)
    before, after, written = PLAN_COMMANDS[command]
    result = invoke(*before, plan, *[arg.format(out=tmp_path) for arg in after])
    assert result.exit_code == 2, result.output
    assert "PWR080" in result.output and str(plan) in result.output
    if written:
        assert not (tmp_path / written).exists()


@pytest.mark.parametrize("case", JSON_CASES)
def test_a_hostile_fleet_lock_is_a_finding_and_is_left_as_it_is(tmp_path, case):
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    lock = hostile(tmp_path, case)
    before = snapshot(lock)
    reviewed = invoke("fleet", "review", fleet, "--lock", lock)
    assert reviewed.exit_code == 1 and "PWR065" in reviewed.output
    assert invoke("rollout", "status", fleet, "--lock", lock).exit_code == 1
    # Asked to record over it: a lock that is not a regular file is no place to write (PWR018, before the review).
    recorded = invoke("fleet", "review", fleet, "--lock", lock, "--write-lock")
    exit_code, code = (1, "PWR065") if lock.is_file() else (2, "PWR018")
    assert recorded.exit_code == exit_code and code in recorded.output
    assert snapshot(lock) == before


@pytest.mark.parametrize("case", TEXT_CASES)
@pytest.mark.parametrize("option", ["--env-file", "--unit"])
def test_a_hostile_launch_file_is_an_input_error(tmp_path, option, case):
    launch = hostile(tmp_path, case, suffix=".env")
    result = invoke("import", "llama-server", option, launch, "-o", tmp_path / "out")
    assert result.exit_code == 2 and "PWR459" in result.output
    assert not (tmp_path / "out").exists()


def test_a_hostile_speculative_config_is_a_finding():
    deep = "[" * 100_000 + "]" * 100_000
    result = invoke("import", "vllm", "--", "vllm", "serve", "m.gguf", "--speculative-config", deep)
    assert result.exit_code == 1 and "PWR457" in result.output


TOML_CODES = {"fifo": "PWR002", "dev-zero": "PWR002", "toml-nested-100k": "PWR008",
              "toml-integer-5000-digits": "PWR016", "toml-integer-past-64-bits": "PWR016", "toml-not-utf8": "PWR006"}


@pytest.mark.parametrize("case", TOML_CODES)
def test_a_hostile_toml_file_is_one_finding_and_the_rest_of_the_directory_is_validated(tmp_path, case):
    bad = hostile(tmp_path, case, suffix=".toml")
    (tmp_path / "good.toml").write_text(FLEET)
    result = invoke("validate", tmp_path, bad, "--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert [(f["file"], f["code"]) for f in report["findings"]] == [(str(bad), TOML_CODES[case])]
    assert {"file": str(tmp_path / "good.toml"), "kind": "fleet", "valid": True} in report["files"]


def test_a_5000_digit_integer_in_a_manifest_is_located(tmp_path):
    manifest = tmp_path / "m.toml"
    manifest.write_text(
        'schema = "power.manifest/v1"\nname = "m"\n[target]\npath = "t.gguf"\nsize = ' + "9" * 5000 + "\n"
    )
    result = invoke("validate", manifest)
    assert result.exit_code == 1 and f"{manifest}:5:8: PWR016" in result.output


@pytest.mark.parametrize("command", ["plan", "size"])
def test_a_5000_digit_device_size_is_a_usage_error(tmp_path, command):
    result = invoke(command, tmp_path / "m.toml", tmp_path / "p.toml", "--device", "9" * 5000)
    assert result.exit_code == 2 and "larger than 1.00 PiB" in result.output


def test_a_fifo_planted_as_the_lock_guard_is_a_finding_not_a_hang(tmp_path):
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    os.mkfifo(tmp_path / ".fleet.lock.guard")
    result = invoke("fleet", "review", fleet, "--write-lock")
    assert result.exit_code == 1 and "PWR018" in result.output and "cannot write the fleet lock" in result.output
    assert not (tmp_path / "fleet.lock").exists()


def test_a_path_longer_than_a_file_name_may_be_is_a_located_finding(tmp_path):
    """Issue 38 item 11: a 5,000-character path is a finding at the key or flag that names it, not an OSError."""
    long = "x" * 5000
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(f'schema = "power.manifest/v1"\nname = "long"\n[target]\npath = "{long}.gguf"\n'
                        f'size = "1 GiB"\nsha256 = "{"a" * 64}"\n')
    profile = Path(__file__).resolve().parent.parent / "profiles" / "target-only.toml"
    for command in ("plan", "size"):
        result = invoke(command, str(manifest), str(profile), "--device", "8 GiB")
        assert result.exit_code == 1 and "Traceback" not in result.output, result.output[-2000:]
        assert "PWR110" in result.output and "cannot be looked up (File name too long)" in result.output
    imported = invoke("import", "llama-server", "-o", str(tmp_path), "--", "-m", f"/{long}")
    assert (
        imported.exit_code == 1 and "PWR458" in imported.output and "is not a file on this machine" in imported.output
    )
