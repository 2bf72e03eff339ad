"""Values past physical sense (a VRAM of 10^41 bytes, NaN rates, a context of 2^40) are refused with a finding or
a usage error through the CLI, never planned, computed or written."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from plan_helpers import write_manifest, write_profile

from power.app.cli import main


def invoke(*args):
    result = CliRunner().invoke(main, [str(arg) for arg in args])
    assert "Traceback" not in result.output and isinstance(result.exception, (SystemExit, type(None))), result.output
    return result


@pytest.mark.parametrize("vram", ["1" + "0" * 41, '"100000000000000000000000000000000000000000 B"', '"1025 TiB"'])
def test_a_host_with_an_absurd_vram_is_a_finding_and_no_plan(tmp_path, vram):
    host = tmp_path / "host.toml"
    host.write_text(f'schema = "power.host/v1"\nname = "h"\ndevices = [{{ model = "x", vram = {vram} }}]\n')
    manifest, profile = write_manifest(tmp_path, "dense-target", [{"kind": "ngram"}]), write_profile(tmp_path, "ngram")
    result = invoke("plan", manifest, profile, "--host", host, "-o", tmp_path / "plan.toml", "--json")
    assert result.exit_code == 1 and not (tmp_path / "plan.toml").exists()
    (finding,) = json.loads(result.stdout)["findings"]
    assert finding["code"] in ("PWR016", "PWR023") and finding["file"] == str(host) and finding["line"] == 3


@pytest.mark.parametrize("device", ["1" + "0" * 41, "9" * 5000, "1025 TiB"])
def test_an_absurd_device_size_is_a_usage_error(tmp_path, device):
    manifest, profile = write_manifest(tmp_path, "dense-target", [{"kind": "ngram"}]), write_profile(tmp_path, "ngram")
    result = invoke("plan", manifest, profile, "--device", device)
    assert result.exit_code == 2 and "larger than 1.00 PiB" in result.output


@pytest.mark.parametrize(("setting", "code"), [
    ("temperature = inf", "PWR409"), ("temperature = nan", "PWR409"),
    ("ctx = 1099511627776", "PWR022"), ("verify_capacity = 100000", "PWR022"),
    ("spec_mtp_recurrent_snapshots = 100000", "PWR402"), ("spec_mtp_fr_vocab_size = 1099511627776", "PWR403"),
    ("gpu_layers = 1099511627776", "PWR022"), ("ngram_match = 100000", "PWR022")])
def test_a_profile_value_past_physical_sense_is_a_finding(tmp_path, setting, code):
    table = "[sampling]" if setting.startswith("temperature") else "" if setting.startswith("spec_") else "[runtime]"
    profile = tmp_path / "p.toml"
    profile.write_text(f'schema = "power.profile/v1"\nname = "p"\n{table}\n{setting}\n')
    result = invoke("validate", profile, "--json")
    assert result.exit_code == 1
    findings = json.loads(result.stdout)["findings"]
    assert [f["code"] for f in findings if f["severity"] == "error"] == [code]


@pytest.mark.parametrize("option", [
    ["--incumbent", "nan"], ["--incumbent", "inf"], ["--incumbent", "-inf"], ["--incumbent", "0"],
    ["--incumbent", "20", "--incumbent-commit", "inf"], ["--incumbent", "20", "--incumbent-commit", "nan"],
    ["--incumbent", "20", "--target-step", "9" * 400 + "ms"], ["--incumbent", "20", "--target-step", "2h"]])
def test_worth_it_refuses_rates_and_steps_that_are_not_finite_and_positive(option):
    result = invoke("worth-it", "--draft-step", "12ms", "-k", "3", *option)
    assert result.exit_code == 2 and "break-even" not in result.output


def test_worth_it_still_answers_for_finite_values():
    result = invoke("worth-it", "--draft-step", "12ms", "-k", "3", "--incumbent", "25", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["break_even"]["3"] is not None


@pytest.mark.parametrize("args", [["run", "--gguf", "m.gguf", "--prompt", "x", "--ctx", str(2**40)],
                                  ["run", "--gguf", "m.gguf", "--prompt", "x", "--verify-capacity", str(2**40)],
                                  ["serve", "plan.json", "--timeout", "nan"]])
def test_runtime_options_past_physical_sense_are_usage_errors(args):
    assert invoke(*args).exit_code == 2
