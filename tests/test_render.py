"""Rendering: golden files per target, current flag names only, hostile values stay inert."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from plan_helpers import codes, compiled, write_manifest, write_profile
from runtime_plans import write_plan

from power.app.cli import main
from power.documents.plan import load_plan, save_plan
from power.orchestrator.launch.render import TARGET_ENGINES, RenderError, env_context, render

GOLDEN = Path(__file__).parent / "golden" / "render"
# The same plans sealed for each engine they render for (a render for another engine than the plan's is refused).
CHAIN_PLAN = GOLDEN / "dspark-ngram.plan.json"
CHAIN_POWER_PLAN = GOLDEN / "dspark-ngram.power.plan.json"
MTP_PLAN = GOLDEN / "mtp.plan.toml"
MTP_VLLM_PLAN = GOLDEN / "mtp.vllm.plan.toml"
CASES = [
    (CHAIN_PLAN, "llama-server", "dspark-ngram.llama-server.sh"),
    (CHAIN_POWER_PLAN, "power", "dspark-ngram.power.sh"),
    (CHAIN_POWER_PLAN, "env", "dspark-ngram.env"),
    (CHAIN_POWER_PLAN, "systemd", "dspark-ngram.systemd.conf"),
    (CHAIN_PLAN, "llama-server-env", "dspark-ngram.llama-server.env"),
    (MTP_PLAN, "llama-server", "mtp.llama-server.sh"),
    (MTP_VLLM_PLAN, "vllm", "mtp.vllm.sh"),
]


def rendered(plan_path: Path, target: str) -> str:
    """The rendering with this checkout's location replaced, so goldens hold on any machine."""
    return render(load_plan(plan_path), target, plan_path, executable="/usr/local/bin/power").replace(
        str(GOLDEN.resolve()), "<golden>")


@pytest.mark.parametrize("plan_path, target, golden", CASES)
def test_golden(plan_path, target, golden):
    text = rendered(plan_path, target)
    golden_file = GOLDEN / golden
    if os.environ.get("POWER_UPDATE_GOLDEN"):
        golden_file.write_text(text)
    assert text == golden_file.read_text()


def test_llama_server_uses_current_flag_names():
    words = shlex.split(rendered(CHAIN_PLAN, "llama-server"), comments=True)
    assert words[words.index("--spec-type") + 1] == "ngram-mod,draft-dspark"
    assert "--spec-draft-model" in words and "--spec-draft-n-max" in words
    for removed in ("--draft-max", "--draft", "--model-draft", "-md", "--draft-min", "mtp", "dspark"):
        assert removed not in words
    mtp_words = shlex.split(rendered(MTP_PLAN, "llama-server"), comments=True)
    assert mtp_words[mtp_words.index("--spec-type") + 1] == "draft-mtp"


def test_features_without_a_flag_are_comments():
    text = rendered(MTP_PLAN, "llama-server")
    assert "# FR = 8192 draft-only token-ID prefix: no flag" in text
    assert "# S = 6 recurrent snapshots (guarded rollback): no flag" in text
    assert "GGML_CUDA_DISABLE_GRAPHS=1" in text


def test_vllm_speculative_config_is_json():
    words = shlex.split(rendered(MTP_VLLM_PLAN, "vllm"), comments=True)
    config = words[words.index("--speculative-config") + 1]
    assert config == '{"method": "mtp", "num_speculative_tokens": 7}'
    assert "--enforce-eager" in words


def test_vllm_refuses_a_chain_instead_of_dropping_a_drafter():
    plan = load_plan(CHAIN_PLAN)
    sealed_for_vllm = type(plan).build(**{**dict(plan), "memory": plan.memory.model_copy(update={"engine": "vllm"}),
                                          "digest": ""})
    with pytest.raises(RenderError, match="one speculative method"):
        render(sealed_for_vllm, "vllm", CHAIN_PLAN)


@pytest.mark.parametrize("plan_path, target", [(CHAIN_PLAN, "vllm"), (CHAIN_PLAN, "power"),
                                               (CHAIN_POWER_PLAN, "llama-server"), (MTP_PLAN, "vllm")])
def test_a_render_for_another_engine_than_the_plans_is_refused(plan_path, target):
    """Issue 23 defect 4: a plan sized for one engine rendered for another said nothing."""
    with pytest.raises(RenderError) as refused:
        render(load_plan(plan_path), target, plan_path)
    assert refused.value.finding.code == "PWR464" and "--engine" in (refused.value.finding.hint or "")


@pytest.mark.parametrize("plan_path, target, instead", [
    (CHAIN_PLAN, "systemd", "--target llama-server-env -o FILE"), (CHAIN_PLAN, "env", "--target llama-server-env"),
    (MTP_VLLM_PLAN, "systemd", "--target vllm")])
def test_the_power_only_targets_say_so_for_another_engines_plan(plan_path, target, instead):
    """Issue 40 (low): `render --target systemd` of a llama-server plan gave a memory reason; the truth is that the
    unit and the env file start `power serve` only, and the engine's own target deploys it."""
    with pytest.raises(RenderError) as refused:
        render(load_plan(plan_path), target, plan_path)
    finding = refused.value.finding
    assert finding.code == "PWR464" and f"--target {target} renders for `power serve`" in finding.message
    assert instead in (finding.hint or "")
    assert ("EnvironmentFile=" in finding.hint) == ("llama-server" in instead)


HOSTILE = "x; touch PWNED; echo $(touch PWNED2) `touch PWNED3` 'q\" %n $HOME"


@pytest.fixture
def hostile_plan(tmp_path, target) -> Path:
    plan = load_plan(CHAIN_PLAN if target == "llama-server" else CHAIN_POWER_PLAN)
    target = plan.target.model_copy(update={"path": str(tmp_path / HOSTILE / "t.gguf")})
    hostile = type(plan).build(**{**dict(plan), "name": HOSTILE, "target": target, "digest": ""})
    path = tmp_path / "hostile plan.json"
    save_plan(hostile, path)
    return path


@pytest.mark.parametrize("target", ["llama-server", "power"])
def test_hostile_names_render_inert_in_shell_scripts(tmp_path, hostile_plan, target):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for engine in ("llama-server", "power"):
        stub = bin_dir / engine
        stub.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
        stub.chmod(0o755)
    script = tmp_path / "launch.sh"
    script.write_text(render(load_plan(hostile_plan), target, hostile_plan))
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, cwd=tmp_path,
                            env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": "/nonexistent"})
    assert result.returncode == 0, result.stderr
    assert not list(tmp_path.glob("PWNED*"))
    argv = result.stdout.splitlines()
    if target == "llama-server":
        assert argv[argv.index("--alias") + 1] == HOSTILE
    else:
        assert argv == ["serve", str(hostile_plan)]


@pytest.mark.parametrize("target", ["env"])
def test_hostile_names_render_inert_in_env_files(tmp_path, hostile_plan, target):
    env_file = tmp_path / "plan.env"
    env_file.write_text(render(load_plan(hostile_plan), target, hostile_plan))
    result = subprocess.run(["bash", "-c", f'set -a; . {shlex.quote(str(env_file))}; printf "%s" "$POWER_NAME"'],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.stdout == HOSTILE and not list(tmp_path.glob("PWNED*"))


# Everything systemd treats specially in a unit: quotes, $ and ${} (expanded in ExecStart=, not in Environment=),
# %specifiers, backslash escapes written as text (\x41, \n), a real newline and tab, spaces, a trailing backslash.
SYSTEMD_HOSTILE = "it's \"q\" $HOME ${X} $$ %n %% \\x41 \\n a\tb\nline two ; \\"
EXECUTABLE = str(Path(sys.executable).with_name("power"))


def _systemd_words(text: str, exec_line: bool) -> list[str]:
    """Words as systemd.syntax(7) reads a double-quoted line: C escapes, `%%` -> `%`, and in ExecStart= `$$` -> `$`.
    Deliberately written from the manual, not from the renderer, to read its output back independently."""
    escapes = {"\\": "\\", '"': '"', "'": "'", "n": "\n", "t": "\t", "s": " "}
    words, i = [], 0
    while i < len(text):
        if text[i] == " ":
            i += 1
            continue
        if text[i] != '"':  # a bare word: only characters no rule touches
            end = text.find(" ", i) if " " in text[i:] else len(text)
            assert set(text[i:end]) <= set("abcdefghijklmnopqrstuvwxyz"), text[i:]
            words.append(text[i:end])
            i = end
            continue
        word, i = "", i + 1
        while text[i] != '"':
            if text[i] == "\\":
                code = text[i + 1]
                if code == "x":
                    word, i = word + chr(int(text[i + 2:i + 4], 16)), i + 4
                else:
                    word, i = word + escapes[code], i + 2
            elif text[i] in "%$" and text[i + 1] == text[i] and (text[i] == "%" or exec_line):
                word, i = word + text[i], i + 2
            else:
                assert text[i] != "%" and (text[i] != "$" or not exec_line), text[i:]
                word, i = word + text[i], i + 1
        words.append(word)
        i += 1
    return words


def _systemd_verify(tmp_path: Path, drop_in: str) -> subprocess.CompletedProcess:
    """`systemd-analyze verify` on a minimal unit with the drop-in installed beside it."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is not installed: run scripts/bootstrap (it installs Debian's systemd package)")
    units = tmp_path / "units"
    (units / "power-test.service.d").mkdir(parents=True)
    (units / "power-test.service").write_text(
        "[Unit]\nDescription=Power render test\n[Service]\nExecStart=/bin/false\n"
    )
    (units / "power-test.service.d" / "power.conf").write_text(drop_in)
    return subprocess.run([analyze, "verify", str(units / "power-test.service")], capture_output=True, text=True,
                          env={**os.environ, "SYSTEMD_UNIT_PATH": f"{units}:"})


def test_systemd_reads_back_exactly_what_the_plan_says(tmp_path):
    plan = load_plan(CHAIN_POWER_PLAN)
    hostile_dir = tmp_path / SYSTEMD_HOSTILE.replace("/", "_")
    hostile_dir.mkdir()
    path = hostile_dir / "plan.json"
    save_plan(type(plan).build(**{**dict(plan), "name": SYSTEMD_HOSTILE, "digest": ""}), path)
    hostile = load_plan(path)
    unit = render(hostile, "systemd", path, executable=EXECUTABLE)
    verified = _systemd_verify(tmp_path, unit)
    assert verified.returncode == 0 and verified.stderr == "" and verified.stdout == "", verified.stderr
    lines = unit.splitlines()
    environment = dict(word.split("=", 1) for line in lines if line.startswith("Environment=")
                       for word in _systemd_words(line.removeprefix("Environment="), exec_line=False))
    assert environment["POWER_NAME"] == SYSTEMD_HOSTILE and environment["POWER_PLAN"] == str(path)
    assert environment == {name: str(value) for name, value in env_context(hostile, path)["variables"].items()}
    assert lines[-2:][0] == "ExecStart="
    assert _systemd_words(lines[-1].removeprefix("ExecStart="), exec_line=True) == [EXECUTABLE, "serve", str(path)]


def test_the_systemd_unit_starts_power_by_absolute_path(tmp_path):
    plan = str(write_plan(tmp_path, "ngram"))  # the command verifies the plan's artifacts: they must exist
    result = CliRunner().invoke(main, ["render", plan, "--target", "systemd"])
    assert result.exit_code == 0, result.output
    exec_line = result.stdout.splitlines()[-1]
    assert exec_line.startswith(f'ExecStart="{EXECUTABLE}" "serve" ')
    assert _systemd_verify(tmp_path, result.stdout).stderr == ""
    chosen = CliRunner().invoke(main, ["render", plan, "--target", "systemd", "--power-executable",
                                       "/opt/power/bin/power"])
    assert chosen.stdout.splitlines()[-1].startswith('ExecStart="/opt/power/bin/power" "serve" ')
    relative = CliRunner().invoke(main, ["render", plan, "--target", "systemd", "--power-executable", "power"])
    assert relative.exit_code == 2 and "PWR462" in relative.output and "Traceback" not in relative.output


def test_line_breaks_cannot_escape_a_comment_or_an_env_line():
    plan = load_plan(CHAIN_PLAN)
    broken = type(plan).build(**{**dict(plan), "name": "x\nrm -rf /", "digest": ""})
    script = render(broken, "llama-server", CHAIN_PLAN)
    assert "\nrm -rf /" not in script.split("exec llama-server")[0]
    power = load_plan(CHAIN_POWER_PLAN)
    with pytest.raises(RenderError, match="control character"):
        render(type(power).build(**{**dict(power), "name": "x\nrm -rf /", "digest": ""}), "env", CHAIN_POWER_PLAN)


def test_command_writes_output_and_refuses_edited_plans(tmp_path):
    out = tmp_path / "launch.sh"
    plan = write_plan(tmp_path, "ngram", engine="llama-server")  # the command verifies the plan's artifacts
    result = CliRunner().invoke(main, ["render", str(plan), "--target", "llama-server", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text().startswith("#!/usr/bin/env bash") and os.access(out, os.X_OK)
    edited = tmp_path / "edited.plan.json"
    edited.write_text(CHAIN_POWER_PLAN.read_text().replace('"k": 10', '"k": 12'))
    result = CliRunner().invoke(main, ["render", str(edited), "--target", "power"])
    assert result.exit_code == 2
    assert "digest mismatch" in result.output


def test_a_manifest_named_rm_rf_renders_as_one_inert_word(tmp_path):
    manifest = write_manifest(tmp_path, "dense-target", [{"kind": "ngram"}])
    manifest.write_text(manifest.read_text().replace('name = "test"', 'name = "x; rm -rf /"'))
    plans = {engine: compiled(manifest, write_profile(tmp_path, "ngram"), engine=engine)[0]
             for engine in ("power", "llama-server")}
    plan = plans["llama-server"]
    assert plan is not None and plan.name == "x; rm -rf /"
    for target in ("llama-server", "power", "env", "systemd"):
        for line in render(plans[TARGET_ENGINES[target]], target, tmp_path / "plan.json").splitlines():
            if "x; rm -rf /" in line:
                # In a comment, or inside an open quote (single in shell lines, double in systemd's).
                quote = '"' if target == "systemd" else "'"
                assert line.startswith("#") or line.split("x; rm -rf /")[0].count(quote) % 2 == 1, (target, line)
    words = shlex.split(render(plan, "llama-server", tmp_path / "plan.json"), comments=True)
    assert words[words.index("--alias") + 1] == "x; rm -rf /" and "rm" not in words


@pytest.mark.parametrize("plan_path", [CHAIN_PLAN, MTP_PLAN])
def test_rendered_llama_server_lines_pass_the_launch_line_review(plan_path):
    script = rendered(plan_path, "llama-server")
    argv = [word for word in shlex.split(script.split("exec ", 1)[1], comments=True) if word != "\n"]
    assert argv[0] == "llama-server"
    result = CliRunner().invoke(main, ["import", "llama-server", "--", *argv[1:]])
    assert result.exit_code == 0, result.output
    assert "0 error(s)" in result.output


def test_vllm_refuses_gguf_drafters_and_sidecars_with_the_reason(tmp_path):
    from plan_helpers import compiled, write_manifest, write_profile

    manifest = write_manifest(tmp_path, "dense-target", [{"kind": "dflash", "fixture": "dflash-drafter"}])
    plan, findings = compiled(manifest, write_profile(tmp_path, "dflash", k=3), engine="vllm")
    assert plan is None and codes(findings) == ["PWR463"], [f.render() for f in findings]
    assert "Hugging Face checkpoints" in findings[0].message and "flash_attn" in findings[0].message
    assert findings[0].file == str(manifest) and findings[0].where == "drafters[0].kind"
    planned, _ = compiled(manifest, write_profile(tmp_path, "dflash", k=3))
    assert planned is not None
    sealed_for_vllm = type(planned).build(**{**dict(planned), "digest": "",
                                             "memory": planned.memory.model_copy(update={"engine": "vllm"})})
    with pytest.raises(RenderError) as refused:
        render(sealed_for_vllm, "vllm", tmp_path / "plan.json")
    assert refused.value.finding.code == "PWR463" and "Hugging Face checkpoints" in str(refused.value)
    sidecar = write_manifest(tmp_path, "headless-hybrid-target", [{"kind": "mtp", "fixture": "mtp-sidecar"}])
    plan, findings = compiled(sidecar, write_profile(tmp_path, "mtp"), engine="vllm")
    assert plan is None and "MTP-only GGUF" in findings[0].message


def test_vllm_runs_the_ngram_window_and_the_slots_of_the_plan(tmp_path):
    from plan_helpers import compiled, write_manifest, write_profile

    manifest = write_manifest(tmp_path, "dense-target", [{"kind": "ngram"}])
    plan, _ = compiled(manifest, write_profile(tmp_path, "ngram", k=5, s=5,
                                               runtime={"slots": 4, "ngram_match": 3, "ngram_draft_min": 2}),
                       engine="vllm")
    words = shlex.split(render(plan, "vllm", tmp_path / "plan.json"), comments=True)
    assert words[words.index("--max-num-seqs") + 1] == "4"
    config = json.loads(words[words.index("--speculative-config") + 1])
    assert config == {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 3, "prompt_lookup_max": 3}
    assert "n-gram shortest draft 2: vLLM has no such setting" in render(plan, "vllm", tmp_path / "plan.json")


def test_the_llama_arg_env_file_names_each_option_as_llama_cpp_does():
    from power.orchestrator.engines.llama_server import flags as llama_flags
    from power.orchestrator.launch.render import Listen, engine_launch

    plan = load_plan(CHAIN_PLAN)
    launch = engine_launch(plan, "llama-server", CHAIN_PLAN, Listen("127.0.0.1", 8081))
    text = render(plan, "llama-server-env", CHAIN_PLAN, listen=Listen("127.0.0.1", 8081))
    variables = dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    extra = shlex.split(shlex.split(variables["LLAMA_SERVER_EXTRA_ARGS"])[0])
    table = llama_flags.table()
    for option in launch.options:
        env = table.option(option[0]).env
        if env is None:
            assert option[0] in extra and list(option) == extra[extra.index(option[0]):][:len(option)]
        elif len(option) == 1:
            assert variables[env] == "false" if option[0].startswith("--no-") else variables[env] == "true"
        else:
            assert shlex.split(variables[env]) == [option[1]]
    assert variables["LLAMA_ARG_PORT"] == "8081" and variables["LLAMA_ARG_KV_UNIFIED"] == "false"


@pytest.mark.parametrize("target", ["power", "env", "systemd", "llama-server", "llama-server-env"])
def test_render_refuses_a_same_size_file_that_is_not_the_planned_one(tmp_path, target):
    """Issue 38 item 6: a target rewritten in place at its planned size renders nothing (PWR115), for every target
    (the digest cache's entry for the old file no longer matches the rewritten one)."""
    engine = "llama-server" if target.startswith("llama-server") else "power"
    plan = write_plan(tmp_path, "ngram", engine=engine)
    assert CliRunner().invoke(main, ["render", str(plan), "--target", target]).exit_code == 0  # hashed and cached
    model = tmp_path / "dense-target.gguf"
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF
    model.write_bytes(bytes(data))
    result = CliRunner().invoke(main, ["render", str(plan), "--target", target])
    assert result.exit_code == 2 and "PWR115" in result.output and "sha256" in result.output, result.output
