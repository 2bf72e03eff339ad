"""No dropped setting: every llama-server option is carried, refused or declared of no effect; offload, split and the
drafter's placement round-trip through import, plan, sizing and render; import findings point at the launch line."""

from __future__ import annotations

import json
import shlex
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from llama_server import binary

from power.app.cli import main
from power.app.live import LiveEngine
from power.artifacts.factory import build_dense_target, build_dflash_drafter
from power.documents.plan import load_plan
from power.orchestrator.engines.llama_server import flags as llama_flags
from power.orchestrator.engines.llama_server import options as llama_options
from power.orchestrator.engines.llama_server.settings import field_of_option, settings_table
from power.orchestrator.engines.vllm import options as vllm_options
from power.orchestrator.engines.vllm.reader import REMOVED as VLLM_REMOVED
from power.orchestrator.engines.vllm.settings import SETTINGS as VLLM_SETTINGS
from power.orchestrator.inputs.launch_lines import options as launch_options
from power.orchestrator.inputs.launch_lines.tokens import COMMAND_LINE, tokens_from_argv, tokens_from_systemd_unit
from power.orchestrator.launch.importer import import_launch, profile_document

GEMMA_FILE = Path(__file__).resolve().parent.parent / "models" / "gemma-3-270m-q4_k_m.gguf"
LLAMA_SERVER, VLLM = "llama-server", "vllm"
# read by the reader apart from the settings table's value readers: the speculative types' list, and a switch
READ_APART = {"spec_type", "kv_unified"}


def _llama(*argv: str):
    return import_launch(LLAMA_SERVER, tokens_from_argv(["llama-server", *argv]))


def test_every_option_of_the_pinned_table_is_in_exactly_one_list():
    rows = Counter(row.option for row in llama_options.ROWS)
    options = llama_flags.table().options
    assert {o.name: rows[o.name] for o in options if rows[o.name] != 1} == {}
    assert set(rows) == {o.name for o in options}  # no row for an option the binary does not have
    for option in options:
        row = llama_options.row(option.name)
        assert row.disposition in {launch_options.CARRIED, launch_options.REFUSED, launch_options.NO_EFFECT}
        assert row.meaning
        if row.disposition == launch_options.CARRIED:
            field = field_of_option(option)
            read = settings_table().reader(field) if field is not None else None
            assert read is not None or field in READ_APART, f"{option.name} is carried but nothing reads {field}"
        if row.disposition == launch_options.REFUSED:
            assert row.fix and row.code in {"PWR444", "PWR446", "PWR447"}
        if option.removed:
            assert row.disposition == launch_options.REFUSED


@pytest.mark.parametrize("row", [r for r in llama_options.ROWS if r.disposition == launch_options.REFUSED
                                 and not llama_flags.table().option(r.option).removed], ids=lambda r: r.option)
def test_each_refused_option_is_a_finding_at_its_flag_with_the_fix(row):
    option = llama_flags.table().option(row.option)
    # a switch refused only when turned off is given its negative spelling
    word = next(s for s in option.spellings if llama_flags.negative(s)) if "on" in row.accepts else row.option
    value = ["x"] * option.values if option.values else []
    result = _llama("-m", "t.gguf", word, *value)
    [finding] = [f for f in result.findings if f.code == row.code]
    assert finding.source_line[finding.col - 1:].startswith(word)
    assert word in finding.message and finding.hint == row.fix


def test_a_refused_option_at_llama_cpps_default_changes_nothing_and_is_not_refused():
    assert _llama("-m", "t.gguf", "--top-k", "0", "--kv-offload", "--repeat-penalty", "1.0").findings == []
    [finding] = _llama("-m", "t.gguf", "--no-kv-offload").findings
    assert finding.code == "PWR444" and "host memory" in finding.message


def test_no_effect_options_read_cleanly():
    result = _llama("-m", "t.gguf", "--port", "8081", "--host", "0.0.0.0", "-t", "8", "--log-file", "x.log",
                    "--fit", "on", "-a", "qwen")
    assert result.findings == []


def test_k_and_v_cache_types_must_agree_and_row_splits_are_refused():
    assert [f.code for f in _llama("-m", "t.gguf", "-ctk", "q8_0", "-ctv", "q8_0").findings] == []
    [mismatch] = _llama("-m", "t.gguf", "-ctv", "q8_0").findings
    assert mismatch.code == "PWR445" and "-ctk q8_0" in mismatch.hint
    [draft] = _llama("-m", "t.gguf", "--spec-draft-type-k", "q8_0", "--spec-draft-type-v", "f16").findings
    assert draft.code == "PWR445"
    [row] = _llama("-m", "t.gguf", "-sm", "row").findings
    assert row.code == "PWR444" and row.source_line[row.col - 1:].startswith("row")


def test_a_drafter_to_download_is_refused_with_the_fix_never_run_without_speculation(tmp_path: Path):
    target = build_dense_target(tmp_path)
    line = ["-m", str(target), "--spec-type", "draft-dflash", "--spec-draft-hf", "org/drafter-GGUF"]
    assert [f.code for f in _llama(*line).findings] == ["PWR447"]
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["import", "llama-server", "-o", str(out), "--", *line])
    assert result.exit_code == 1 and "PWR447" in result.output and "--spec-draft-model PATH" in result.output
    assert not out.exists()


def _import(tmp_path: Path, name: str, *line: str) -> dict:
    target, drafter = build_dense_target(tmp_path), build_dflash_drafter(tmp_path)
    result = CliRunner().invoke(main, ["import", "llama-server", "-o", str(tmp_path / name), "--json",
                                       "--device", "8 GiB", "--device", "8 GiB", "--", "-m", str(target),
                                       "-md", str(drafter), "--spec-type", "draft-dflash", *line])
    assert result.exit_code == 0, result.output
    plan = CliRunner().invoke(main, ["plan", str(tmp_path / name / "manifest.toml"),
                                     str(tmp_path / name / "profile.toml"), "--device", "8 GiB", "--device", "8 GiB",
                                     "-o", str(tmp_path / f"{name}.plan.json")])
    assert plan.exit_code == 0, plan.output
    return json.loads(result.output)


def _bytes(plan: dict, position: int, name: str) -> int:
    return sum(c["bytes"] for c in plan["memory"]["devices"][position]["components"] if c["name"] == name)


def test_offload_split_and_the_drafters_device_round_trip_through_plan_and_render(tmp_path: Path):
    line = ["-ngl", "40", "-ts", "3,1", "--spec-draft-device", "CUDA1", "-ngld", "99"]
    report = _import(tmp_path, "placed", *line)
    runtime = report["documents"]["profile"]["runtime"]
    assert (runtime["gpu_layers"], runtime["tensor_split"], runtime["draft_device"], runtime["draft_gpu_layers"]) == \
        (40, [3.0, 1.0], 1, 99)
    plan = json.loads((tmp_path / "placed.plan.json").read_text())
    # 4 layers + the output layer split 3:1: the layers on the first device, the output layer on the second;
    # the drafter wholly on the second
    assert [d["holds"] for d in plan["memory"]["devices"]] == ["layers 0-3", "no layers + output layer"]
    drafter = _bytes(plan, 1, "drafter weights")
    assert drafter > 0 and _bytes(plan, 0, "drafter weights") == 0
    assert [d["total_bytes"] for d in report["documents"]["plan"]["devices"]] == \
        [d["total_bytes"] for d in plan["memory"]["devices"]]
    rendered = CliRunner().invoke(main, ["render", str(tmp_path / "placed.plan.json"), "--target", "llama-server"])
    assert rendered.exit_code == 0, rendered.output
    words = shlex.split(rendered.output.split("exec ", 1)[1].replace("\\\n", " "))
    given = {"-ngl": "40", "-ts": "3,1", "--spec-draft-device": "CUDA1", "--spec-draft-ngl": "99", "-sm": "layer"}
    assert {flag: words[words.index(flag) + 1] for flag in given} == given
    # the same line without the drafter's device: the drafter is split like the target, so none of it on device 1
    _import(tmp_path, "shared", "-ngl", "40", "-ts", "3,1")
    shared = json.loads((tmp_path / "shared.plan.json").read_text())
    assert _bytes(shared, 1, "drafter weights") == 0 and _bytes(shared, 0, "drafter weights") == drafter


def test_layers_left_on_the_host_are_sized_in_host_memory(tmp_path: Path):
    _import(tmp_path, "partial", "-ngl", "2", "-ngld", "0")
    plan = json.loads((tmp_path / "partial.plan.json").read_text())
    # 4 layers + output, 2 offloaded: layer 3 and the output layer on the devices, layers 0-2
    # and the drafter on the host
    assert "".join(d["holds"] for d in plan["memory"]["devices"]).count("layers 3") == 1
    host = {c["name"]: c["bytes"] for c in plan["memory"]["host"]}
    assert host["drafter weights"] > 0
    assert all(_bytes(plan, position, "drafter weights") == 0 for position in (0, 1))


def test_the_drafters_placement_is_refused_by_engines_that_run_it_with_the_target(tmp_path: Path):
    _import(tmp_path, "host", "-ngld", "0")
    folder = tmp_path / "host"
    result = CliRunner().invoke(main, ["plan", str(folder / "manifest.toml"), str(folder / "profile.toml"),
                                       "--device", "8 GiB", "--engine", "power"])
    assert result.exit_code == 1 and "PWR531" in result.output and "runtime.draft_device" in result.output


def test_a_drafter_device_the_deployment_does_not_have_is_refused_at_its_key(tmp_path: Path):
    _import(tmp_path, "placed", "--spec-draft-device", "CUDA1")
    folder = tmp_path / "placed"
    one = CliRunner().invoke(main, ["plan", str(folder / "manifest.toml"), str(folder / "profile.toml"),
                                    "--device", "8 GiB"])
    assert one.exit_code == 1 and "PWR530" in one.output and "profile.toml:" in one.output


def test_a_finding_about_a_defaulted_key_points_at_the_line_and_names_the_flag_to_add(tmp_path: Path):
    target = build_dense_target(tmp_path)
    result = CliRunner().invoke(main, ["import", "llama-server", "-o", str(tmp_path / "out"), "--json", "--",
                                       "-m", str(target), "--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "16"])
    assert result.exit_code == 1
    [finding] = json.loads(result.output)["findings"]
    assert finding["code"] == "PWR411" and finding["file"] == COMMAND_LINE
    assert "profile.toml" not in json.dumps(finding) and "ngram_draft_min" not in json.dumps(finding)
    assert finding["hint"].startswith("add --spec-ngram-mod-n-min N to the line")
    assert "llama.cpp's default 48 applies" in finding["message"]
    assert not (tmp_path / "out").exists()


def test_a_set_key_points_at_its_flag(tmp_path: Path):
    target = build_dense_target(tmp_path)
    argv = ["-m", str(target), "-c", "99999999"]
    result = CliRunner().invoke(main, ["import", "llama-server", "-o", str(tmp_path / "out"), "--json", "--", *argv])
    [finding] = json.loads(result.output)["findings"]
    assert (finding["file"], finding["code"]) == (COMMAND_LINE, "PWR022") and finding["message"].startswith("-c ")
    assert shlex.join(argv)[finding["col"] - 1:].startswith("-c 99999999")


def test_an_undefined_variable_in_a_unit_is_one_finding_not_a_contradiction(tmp_path: Path):
    unit = tmp_path / "llama.service"
    unit.write_text("[Service]\nExecStart=/usr/bin/llama-server -m /m/t.gguf $EXTRA -c 4096\n")
    result = import_launch(LLAMA_SERVER, tokens_from_systemd_unit(unit, None))
    assert [f.code for f in result.findings] == ["PWR442"] and result.spec.ctx == 4096


def test_every_vllm_argument_power_reads_is_carried_refused_or_of_no_effect():
    for row in vllm_options.ROWS:
        assert row.disposition in {launch_options.CARRIED, launch_options.REFUSED, launch_options.NO_EFFECT}
        if row.disposition == launch_options.CARRIED:
            field = VLLM_SETTINGS.field_of_flag(row.option)
            read = VLLM_SETTINGS.reader(field) if field is not None else None
            assert row.option in vllm_options.SPECULATIVE or read is not None or field == "eager", row.option
    assert not set(vllm_options.by_flag()) & set(VLLM_REMOVED)  # removed flags are PWR456's


def test_a_vllm_line_carries_what_power_reads_and_names_everything_else():
    result = import_launch(VLLM, tokens_from_argv([
        "vllm", "serve", "t.gguf", "--tensor-parallel-size", "2", "--enforce-eager", "--max-num-seqs", "8",
        "--gpu-memory-utilization", "0.9", "--kv-cache-dtype", "auto", "--generation-config", "vllm",
        "--max-loras", "3", "--tokenizer", "Qwen/Qwen3", "--kv-cache-dtype", "fp8"]))
    assert [(f.code, f.source_line[f.col - 1:].split()[0]) for f in result.findings] == [
        ("PWR446", "--max-loras"), ("PWR444", "--tokenizer"), ("PWR444", "fp8")]
    runtime = profile_document(result.spec)["runtime"]
    assert (runtime["tensor_parallel"], runtime["cuda_graphs"], runtime["slots"]) == (2, False, 8)
    assert "kv_cache_type" not in runtime


@pytest.mark.llama_server
def test_an_imported_line_with_offload_and_split_settings_renders_a_line_the_real_server_runs(tmp_path: Path):
    """The carried offload and split settings come back as flags the pinned llama-server starts with."""
    host = tmp_path / "cpu.toml"
    host.write_text('schema = "power.host/v1"\nname = "cpu"\n\n[[devices]]\nmodel = "cpu"\nvram = "16 GiB"\n'
                    'kind = "cpu"\n')
    out = tmp_path / "imported"
    line = ["-m", str(GEMMA_FILE), "-c", "1024", "-np", "1", "--spec-type", "ngram-mod", "--spec-ngram-mod-n-min",
            "2", "--spec-ngram-mod-n-max", "8", "-ngl", "0", "-sm", "none", "-mg", "0", "--threads", "1",
            "--port", "8080", "--log-disable", "--top-k", "0"]
    result = CliRunner().invoke(main, ["import", "llama-server", "-o", str(out), "--host", str(host), "--", *line])
    assert result.exit_code == 0, result.output
    plan_path = tmp_path / "imported.plan.json"
    planned = CliRunner().invoke(main, ["plan", str(out / "manifest.toml"), str(out / "profile.toml"),
                                        "--host", str(host), "-o", str(plan_path)])
    assert planned.exit_code == 0, planned.output
    plan = load_plan(plan_path)
    assert (plan.runtime.gpu_layers, plan.runtime.split_mode, plan.runtime.main_gpu) == (0, "none", 0)
    engine = LiveEngine("llama-server", plan, plan_path, binary(), threads=1)
    try:
        engine.start_process()
        engine.wait_healthy()
        assert engine.get_json("/health") == {"status": "ok"}
        argv = engine.process.args if engine.process is not None else []
        assert "-ngl" in argv and argv[argv.index("-ngl") + 1] == "0"
    finally:
        engine.stop()


def test_drafter_tensors_placed_by_name_are_sized_where_they_go_and_rendered_back(tmp_path: Path):
    _import(tmp_path, "overrides", "-ts", "1,1", "--spec-draft-device", "CUDA1", "-otd", r"blk\.0\..*=CUDA0,fc=CPU")
    plan = json.loads((tmp_path / "overrides.plan.json").read_text())
    _import(tmp_path, "whole", "-ts", "1,1", "--spec-draft-device", "CUDA1")
    whole = json.loads((tmp_path / "whole.plan.json").read_text())
    host = {c["name"]: c["bytes"] for c in plan["memory"]["host"]}
    whole_host = {c["name"]: c["bytes"] for c in whole["memory"]["host"]}
    moved_to_0 = _bytes(plan, 0, "drafter weights")
    assert moved_to_0 > 0 and _bytes(whole, 0, "drafter weights") == 0
    assert host.get("drafter weights", 0) > whole_host.get("drafter weights", 0)  # fc.weight in host memory
    assert _bytes(plan, 1, "drafter weights") + moved_to_0 + host.get("drafter weights", 0) == \
        _bytes(whole, 1, "drafter weights") + whole_host.get("drafter weights", 0)
    rendered = CliRunner().invoke(main, ["render", str(tmp_path / "overrides.plan.json"), "--target", "llama-server"])
    words = shlex.split(rendered.output.split("exec ", 1)[1].replace("\\\n", " "))
    assert words[words.index("--spec-draft-override-tensor") + 1] == r"blk\.0\..*=CUDA0,fc=CPU"


@pytest.mark.parametrize(("entry", "devices"), [("fc=GPU", 2), ("fc=CUDA2", 2), ("(=CPU", 2)])
def test_a_drafter_tensor_placement_that_cannot_be_sized_is_a_located_finding(tmp_path: Path, entry, devices):
    target, drafter = build_dense_target(tmp_path), build_dflash_drafter(tmp_path)
    out = tmp_path / "out"
    sizes = [arg for _ in range(devices) for arg in ("--device", "8 GiB")]
    result = CliRunner().invoke(main, ["import", "llama-server", "-o", str(out), *sizes, "--", "-m", str(target),
                                       "-md", str(drafter), "--spec-type", "draft-dflash", "-otd", entry])
    assert result.exit_code == 1 and ("PWR444" in result.output or "PWR532" in result.output), result.output
    assert "<command line>:1:" in result.output and not out.exists()
