"""`power plan` end to end on the bundled Gemma manifest: plan files, refusals, exit codes, the plan's consumers."""

from __future__ import annotations

import json
import tomllib

from click.testing import CliRunner
from gguf_helpers import REPO, gemma

from power.app.cli import main
from power.documents.plan import ResolvedPlan, load_plan
from power.orchestrator.launch.render import render

MANIFEST = REPO / "manifests" / "gemma3-270m.toml"
PROFILES = REPO / "profiles"
HOST = REPO / "examples" / "hosts" / "rtx4090.toml"


def plan_command(*args):
    gemma()
    return CliRunner().invoke(main, ["plan", *map(str, args)])


def test_plan_writes_a_loadable_plan_and_prints_its_summary(tmp_path):
    out = tmp_path / "plan.json"
    result = plan_command(MANIFEST, PROFILES / "ngram.toml", "--device", "24 GiB", "-o", out)
    assert result.exit_code == 0, result.output
    plan = load_plan(out)
    assert plan.digest in result.stdout and "mode     ngram" in result.stdout and "largest context" in result.stdout
    assert plan.target.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert plan.target.size == 253_113_024 and plan.target.vocab_size == 262_144
    assert (plan.mode.resolved, plan.speculation.k, plan.speculation.rollback) == ("ngram", 7, "full")
    assert plan.sources.manifest.path == str(MANIFEST.resolve())
    assert plan.memory.verdict == "fits" and plan.devices[0].vram_bytes == 24 << 30


def test_json_and_toml_print_the_same_plan(tmp_path):
    as_json = plan_command(MANIFEST, PROFILES / "target-only.toml", "--host", HOST, "--json")
    as_toml = plan_command(MANIFEST, PROFILES / "target-only.toml", "--host", HOST, "--toml")
    assert as_json.exit_code == as_toml.exit_code == 0
    document = json.loads(as_json.stdout)
    assert ResolvedPlan.model_validate(tomllib.loads(as_toml.stdout)) == ResolvedPlan.model_validate(document)
    assert document["sources"]["host"]["path"] == str(HOST.resolve()) and document["mode"]["resolved"] == "none"
    saved = tmp_path / "plan.toml"
    saved.write_text(as_toml.stdout)
    assert load_plan(saved).digest == document["digest"]


def test_refusal_prints_every_finding_with_its_place_and_exits_1():
    result = plan_command(MANIFEST, PROFILES / "balanced-k7s7.toml", "--device", "24GiB")
    assert result.exit_code == 1
    assert f"{PROFILES / 'balanced-k7s7.toml'}:5:13: PWR216" in result.stderr
    assert "never downgrades" in result.stderr and "no plan: 1 error(s)" in result.stderr
    assert result.stdout == ""


def test_refusal_as_json():
    result = plan_command(MANIFEST, PROFILES / "balanced-k7s7.toml", "--device", "24GiB", "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["plan"] is None and [f["code"] for f in data["findings"]] == ["PWR216"]


def test_a_tiny_device_is_refused_by_how_much():
    result = plan_command(MANIFEST, PROFILES / "ngram.toml", "--device", "256 MiB")
    assert result.exit_code == 1 and "PWR500" in result.stderr and "over by" in result.stderr


def test_usage_errors_exit_2(tmp_path):
    assert plan_command(MANIFEST, PROFILES / "ngram.toml").exit_code == 2
    assert plan_command(MANIFEST, PROFILES / "ngram.toml", "--device", "24 Gb").exit_code == 2
    missing = plan_command(tmp_path / "nope.toml", PROFILES / "ngram.toml", "--device", "24GiB")
    assert missing.exit_code == 2 and "PWR001" in missing.stderr


def test_the_compiled_plan_renders(tmp_path):
    out = tmp_path / "plan.json"
    assert plan_command(MANIFEST, PROFILES / "ngram.toml", "--device", "24 GiB", "--engine", "llama-server",
                        "-o", out).exit_code == 0
    script = render(load_plan(out), "llama-server", out)
    assert "--spec-type ngram-mod" in script and "--spec-ngram-mod-n-match 4" in script
    assert "--spec-ngram-mod-n-min 2" in script and "--spec-ngram-mod-n-max 7" in script
    assert str(gemma().resolve()) in script
