"""`power validate` and `power schema` through the click entry point: output, --json shape, exit codes."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner
from toml_helpers import PROFILE_HEAD, write

from power.app.cli import main

REPO = Path(__file__).resolve().parents[1]
POWER = shutil.which("power", path=str(Path(sys.executable).parent))


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def broken_copy_of_the_default_profile(directory: Path) -> Path:
    """balanced-k7s7.toml with a typo'd key, K = 0 and FR = "big"."""
    text = (REPO / "profiles" / "balanced-k7s7.toml").read_text()
    text = text.replace("spec_mtp_adaptive = false", "spec_mtp_adaptiv = false")
    text = text.replace("spec_draft_max = 7 ", "spec_draft_max = 0 ")
    text = text.replace("spec_mtp_recurrent_snapshots = 7", 'spec_mtp_recurrent_snapshots = '
                                                            '7\nspec_mtp_fr_vocab_size = "big"')
    path = directory / "broken.toml"
    path.write_text(text)
    return path


def test_the_committed_manifests_and_profiles_pass():
    result = run("validate", str(REPO / "manifests"), str(REPO / "profiles"))
    assert result.exit_code == 0, result.output
    count = len([*(REPO / "manifests").glob("*.toml"), *(REPO / "profiles").glob("*.toml")])
    assert result.output.splitlines()[-1].startswith(f"{count} files valid (0 errors, 0 warnings, ")


def test_a_broken_profile_gives_three_located_findings_in_one_run(tmp_path):
    path = broken_copy_of_the_default_profile(tmp_path)
    result = run("validate", "--json", str(path))
    assert result.exit_code == 1
    report = json.loads(result.output)
    located = [(f["code"], f["line"], f["col"], f["where"]) for f in report["findings"]]
    assert located == [
        ("PWR401", 6, 18, "spec_draft_max"),
        ("PWR403", 8, 26, "spec_mtp_fr_vocab_size"),
        ("PWR020", 9, 1, "spec_mtp_adaptiv"),
    ]
    assert report["findings"][2]["hint"] == "did you mean `spec_mtp_adaptive`?"
    text = run("validate", str(path)).output
    assert f"{path}:6:18: PWR401 [error]" in text
    assert "  6 | spec_draft_max = 0 " in text
    assert text.splitlines()[-1] == "3 errors, 0 warnings, 0 info in 1 file"


def test_json_shape(tmp_path):
    good = write(tmp_path, "good.toml", PROFILE_HEAD)
    bad = write(tmp_path, "bad.toml", PROFILE_HEAD + "spec_mtp_recurrent_snapshots = 9\n")
    report = json.loads(run("validate", "--json", str(good), str(bad)).output)
    assert set(report) == {"findings", "files", "summary"}
    finding = report["findings"][0]
    assert {"code", "severity", "file", "line", "col", "message", "hint"} <= set(finding)
    assert (finding["code"], finding["severity"], finding["file"], finding["line"]) == (
        "PWR407",
        "warning",
        str(bad),
        3,
    )
    assert report["files"] == [
        {"file": str(good), "kind": "profile", "valid": True},
        {"file": str(bad), "kind": "profile", "valid": True},
    ]
    assert report["summary"] == {"files": 2, "errors": 0, "warnings": 1, "info": 0, "valid": True}


def test_warnings_alone_exit_zero(tmp_path):
    path = write(tmp_path, "p.toml", PROFILE_HEAD + 'spec_mode = "draft-model"\n')
    result = run("validate", str(path))
    assert result.exit_code == 0 and "PWR410 [warning]" in result.output


def test_directories_are_searched_recursively_skipping_hidden_ones_and_globs_expand(tmp_path):
    write(tmp_path, "a/one.toml", PROFILE_HEAD)
    write(tmp_path, "a/deeper/two.toml", PROFILE_HEAD)
    write(tmp_path, "a/.hidden/three.toml", "not toml at all [")
    write(tmp_path, "a/notes.txt", "ignored")
    report = json.loads(run("validate", "--json", str(tmp_path / "a")).output)
    assert [Path(f["file"]).name for f in report["files"]] == ["two.toml", "one.toml"]
    globbed = json.loads(run("validate", "--json", str(tmp_path / "a" / "**" / "*.toml"), str(tmp_path / "a")).output)
    assert sorted(Path(f["file"]).name for f in globbed["files"]) == ["one.toml", "two.toml"]


def test_usage_errors_exit_2_with_the_finding_on_stderr(tmp_path):
    (tmp_path / "empty").mkdir()
    good = write(tmp_path, "good.toml", PROFILE_HEAD)
    result = subprocess.run(
        [POWER, "validate", str(tmp_path / "missing.toml"), str(tmp_path / "empty"), str(tmp_path / "*.yaml"),
         str(good)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert f"{tmp_path / 'missing.toml'}: PWR001 [error]" in result.stderr
    assert f"{tmp_path / 'empty'}: PWR009 [error]" in result.stderr
    assert f"{tmp_path / '*.yaml'}: PWR009 [error]" in result.stderr
    assert result.stdout.strip() == "1 file valid"


def test_no_paths_is_a_usage_error():
    assert run("validate").exit_code == 2


def test_bad_input_files_exit_1_never_a_traceback(tmp_path):
    (tmp_path / "bin.toml").write_bytes(b"\x00\x01\x02")
    (tmp_path / "empty.toml").write_text("")
    (tmp_path / "wrong.toml").write_text('schema = "power.nope/v1"\n')
    result = run("validate", str(tmp_path))
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert [line.split(": ")[1].split()[0] for line in result.output.splitlines() if ": PWR" in line] == [
        "PWR005",
        "PWR004",
        "PWR011",
    ]


def test_findings_per_file_are_bounded_and_the_rest_counted(tmp_path):
    keys = "".join(f"unknown_{i} = {i}\n" for i in range(1000))
    many = write(tmp_path, "many.toml", PROFILE_HEAD + "spec_draft_max = 0\n" + keys)
    result = run("validate", str(many), "--json")
    findings = json.loads(result.stdout)["findings"]
    assert result.exit_code == 1 and len(findings) == 201
    # The first 200 in file order (spec_draft_max comes first), then one finding that counts the rest.
    assert findings[0]["code"] == "PWR401" and {f["code"] for f in findings[1:200]} == {"PWR020"}
    assert findings[200]["code"] == "PWR017" and "801 more finding(s)" in findings[200]["message"]
    assert findings[200]["severity"] == "error"


def test_schema_prints_the_committed_json_schema():
    for kind in ("manifest", "profile", "host", "fleet"):
        result = run("schema", kind)
        assert result.exit_code == 0
        assert json.loads(result.output) == json.loads(
            (REPO / "power" / "orchestrator" / "schemas" / f"{kind}.json").read_text()
        )
    assert run("schema", "plan").exit_code == 2


def test_help_lists_validate_and_schema():
    output = run("--help").output
    assert "validate" in output and "schema" in output


def test_the_installed_console_script():
    result = subprocess.run([POWER, "validate", str(REPO / "manifests")], capture_output=True, text=True)
    count = len(list((REPO / "manifests").glob("*.toml")))
    assert result.returncode == 0 and result.stdout.strip() == f"{count} files valid"


def _caret_line(text: str, source: str) -> str:
    """The caret line printed under the source line `source`."""
    lines = text.splitlines()
    return lines[lines.index(source) + 1]


def test_carets_underline_the_whole_value_or_key(tmp_path):
    path = write(tmp_path, "p.toml", PROFILE_HEAD + 'spec_mode = "dflash3"\nspec_draft_max = 100   # K\n'
                 'spec_mtp_adaptiv = false\n[runtime]\nctx = "lots of tokens"\n')
    text = run("validate", str(path)).output
    assert _caret_line(text, '  3 | spec_mode = "dflash3"') == "  " + " " * len("3 | spec_mode = ") + "^" * 9
    assert _caret_line(text, "  4 | spec_draft_max = 100   # K") == "  " + " " * len("4 | spec_draft_max = ") + "^^^"
    assert _caret_line(text, "  5 | spec_mtp_adaptiv = false") == "  " + " " * len("5 | ") + "^" * 16
    assert _caret_line(text, '  7 | ctx = "lots of tokens"') == "  " + " " * len("7 | ctx = ") + "^" * 16
    spans = [(f["line"], f["col"], f["end_col"]) for f in json.loads(run("validate", "--json",
                                                                         str(path)).output)["findings"]]
    assert spans == [(3, 13, 22), (4, 18, 21), (5, 1, 17), (7, 7, 23)]


def test_a_value_over_several_lines_is_underlined_to_the_end_of_its_first(tmp_path):
    path = write(tmp_path, "h.toml", 'schema = "power.host/v1"\nname = "h"\ndevices = [\n  { model = "x", '
                 'vram = "1 GiB" },\n]\nheadroom = [ "512 MiB",\n  "1 GiB" ]\n')
    finding = json.loads(run("validate", "--json", str(path)).output)["findings"][0]
    assert (finding["where"], finding["line"], finding["col"], finding["end_col"]) == ("headroom", 6, 12, 24)
    assert _caret_line(run("validate", str(path)).output, '  6 | headroom = [ "512 MiB",') == (
        "  " + " " * len("6 | headroom = ") + "^" * 12)


def test_unknown_keys_are_found_inside_tables_of_tables(tmp_path):
    fleet = write(tmp_path, "fleet.toml", """
        schema = "power.fleet/v1"
        [kubernetes.volumes.models]
        host_path = "/srv/models"
        local = "models"
        mount_pth = "/models"
        [[hosts]]
        name = "a"
        devices = [{ model = "x", vram = "24 GiB", vrma = 1 }]
        """)
    (tmp_path / "models").mkdir()
    findings = json.loads(run("validate", str(fleet), "--json").stdout)["findings"]
    assert [(f["code"], f["line"], f["where"]) for f in findings] == [
        ("PWR020", 5, "kubernetes.volumes.models.mount_pth"), ("PWR020", 8, "hosts[0].devices[0].vrma")]
    assert findings[0]["hint"] == "did you mean `mount_path`?"


def test_control_characters_from_a_file_never_reach_the_terminal_raw(tmp_path):
    """Issue 26 (low): a file name with an escape sequence and a line break is shown escaped in every finding."""
    from click.testing import CliRunner

    from power.app.cli import main

    path = tmp_path / "p\x1b[2J\nfile.toml:1:1: PWR000 [error] forged.toml"
    path.write_text(PROFILE_HEAD + 'spec_mode = "nope"\n')
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 1
    assert "\x1b" not in result.output and "\\x1b[2J" in result.output
    assert not any(line.startswith("file.toml:1:1") for line in result.output.splitlines())


def test_powers_own_json_documents_are_recognised_not_broken_toml(tmp_path, monkeypatch):
    """Issue 40.7: `power validate out/plan.json` and `power validate examples/fleet/fleet.lock` said PWR007 (TOML
    syntax). A plan and a fleet lock Power wrote are named for what they are (PWR014, info): exit 0."""
    from fleet_world import build_world

    monkeypatch.setenv("POWER_CACHE_DIR", str(tmp_path / "cache"))
    world = build_world(tmp_path / "world")
    fleet = world.fleet('[[hosts]]\nname = "ws-1"\ndevices = [{ model = "RTX 4090", vram = "24 GiB" }]\n',
                        '[[deployments]]\nhost = "ws-1"\nmanifest = "manifests/dense.toml"\n'
                        'profile = "profiles/ngram.toml"\n')
    assert run("fleet", "review", str(fleet), "--write-lock").exit_code == 0
    plan = tmp_path / "plan.json"
    assert run("plan", str(world.root / "manifests" / "dense.toml"), str(world.root / "profiles" / "ngram.toml"),
               "--device", "24 GiB", "-o", str(plan)).exit_code == 0
    result = run("validate", str(plan), str(world.lock))
    assert result.exit_code == 0, result.output
    assert "PWR007" not in result.output and result.output.count("PWR014") == 2
    assert "a plan document that Power generated" in result.output
    assert "a fleet-lock document that Power generated" in result.output
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema": "power.plan/v1", ')
    assert "PWR007" in run("validate", str(broken)).output


def test_a_fleet_naming_an_undefined_host_fails_validate(tmp_path):
    """Issue 40.7: only `fleet review` reported PWR060; the fleet file alone says the host is not defined."""
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('schema = "power.fleet/v1"\n\n[[hosts]]\nname = "ws-1"\n'
                     'devices = [{ model = "RTX 4090", vram = "24 GiB" }]\n\n'
                     '[[deployments]]\nhost = "ws-01"\nmanifest = "manifests/qwen.toml"\nprofile = '
                     '"profiles/p.toml"\n\n[[deployments]]\nhost = "ws-1"\ndevice = 2\nmanifest = '
                     '"manifests/qwen.toml"\nprofile = "profiles/p.toml"\n')
    result = run("validate", str(fleet))
    assert result.exit_code == 1, result.output
    assert f"{fleet}:8:8: PWR060 [error] deployment ws-01/qwen names host 'ws-01'" in result.output
    assert "did you mean 'ws-1'?" in result.output
    assert f"{fleet}:14:10: PWR060 [error] host ws-1 has 1 device(s); there is no device 2" in result.output


def test_a_renamed_setting_one_table_too_high_says_where_it_goes(tmp_path):
    """Issue 40 (low): a top-level `n_ctx` got PWR020 (unknown key) instead of the rename hint it gets in [runtime]."""
    profile = tmp_path / "p.toml"
    profile.write_text('schema = "power.profile/v1"\nname = "p"\nn_ctx = 4096\n')
    result = run("validate", str(profile))
    assert result.exit_code == 1 and f"{profile}:3:1: PWR026 [error] `n_ctx` is not Power's name" in result.output
    assert "hint: set `ctx` in [runtime] instead" in result.output and "PWR020" not in result.output
