"""`power import`: existing llama-server / vLLM launches read into Power terms, each known mistake a located finding."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from power.app.cli import main
from power.artifacts.factory import (
    build_dense_target,
    build_dflash_drafter,
    build_dspark_drafter,
    build_headless_hybrid_target,
    build_mtp_sidecar,
)
from power.orchestrator.launch.importer import env_names, import_launch

LLAMA_SERVER, VLLM = "llama-server", "vllm"
from power.orchestrator.inputs.launch_lines.tokens import (
    COMMAND_LINE,
    tokens_from_argv,
    tokens_from_env_file,
    tokens_from_systemd_unit,
)


def _codes(result) -> list[str]:
    return [f.code for f in result.findings]


def _llama(*argv: str):
    return import_launch(LLAMA_SERVER, tokens_from_argv(["llama-server", *argv]))


def test_the_renamed_spec_type_mtp_is_caught_at_its_column() -> None:
    result = _llama("-m", "t.gguf", "--spec-type", "mtp", "--spec-draft-n-max", "2")
    [finding] = result.findings
    assert finding.code == "PWR450"
    assert finding.file == COMMAND_LINE and finding.line == 1
    assert finding.source_line[finding.col - 1:].startswith("mtp")
    assert "draft-mtp" in finding.hint and "silently" in finding.message
    assert result.spec.mode == "none"


def test_a_draft_model_without_spec_type() -> None:
    result = _llama("-m", "t.gguf", "-md", "d.gguf")
    assert _codes(result) == ["PWR451"]
    assert result.findings[0].source_line[result.findings[0].col - 1:].startswith("d.gguf")


def test_a_draft_model_no_listed_type_runs() -> None:
    result = _llama("-m", "t.gguf", "-md", "d.gguf", "--spec-type", "ngram-mod")
    assert _codes(result) == ["PWR451"] and "it is never used" in result.findings[0].message


def test_two_context_backed_drafters_in_one_list() -> None:
    result = _llama("-m", "t.gguf", "-md", "d.gguf", "--spec-type", "draft-mtp,draft-dflash")
    assert _codes(result) == ["PWR452"]
    assert "draft-mtp and draft-dflash" in result.findings[0].message


def test_removed_draft_spellings_each_get_a_finding_with_the_new_name() -> None:
    result = _llama("-m", "t.gguf", "--spec-type", "draft-mtp", "--draft-max", "8", "--draft-min", "1")
    assert _codes(result) == ["PWR454", "PWR454"]
    assert result.findings[0].hint == "use --spec-draft-n-max or --spec-ngram-mod-n-max"
    assert result.findings[1].hint == "use --spec-draft-n-min or --spec-ngram-mod-n-min"
    # the error llama-server prints, word for word (common/arg.cpp: arg_removed)
    assert ('`error while handling argument "--draft-max": the argument has been removed. use --spec-draft-n-max '
            'or --spec-ngram-mod-n-max`') in result.findings[0].message


@pytest.mark.parametrize("flag, reason", [
    ("--spec-ngram-size-n", "use the respective --spec-ngram-*-size-n"),
    ("--spec-ngram-size-m", "use the respective --spec-ngram-*-size-m"),
    ("--spec-ngram-min-hits", "use the respective --spec-ngram-*-min-hits"),
    ("--spec_ngram_size_n", "use the respective --spec-ngram-*-size-n"),  # llama.cpp reads `_` as `-` in long options
])
def test_removed_ngram_size_options_stop_the_server(flag, reason):
    [finding] = _llama("-m", "t.gguf", "--spec-type", "ngram-mod", flag, "12").findings
    assert finding.code == "PWR454" and reason in finding.message
    assert f'error while handling argument "{flag.replace("_", "-")}": the argument has been removed' in finding.message


def test_a_legal_chain_reads_cleanly_into_power_terms() -> None:
    result = _llama("-m", "t.gguf", "-md", "d.gguf", "--spec-type", "draft-dflash,ngram-mod",
                    "--spec-draft-n-max", "15", "-c", "8192", "-fa", "on", "--jinja", "-ctk", "q8_0")
    assert result.findings == []
    spec = result.spec
    assert (spec.mode, spec.chain, spec.k, spec.ctx) == ("dflash", ["ngram", "dflash"], 15, 8192)
    assert spec.model.text == "t.gguf" and spec.draft_model.text == "d.gguf"
    assert spec.flash_attn is True and spec.kv_cache_type == "q8_0"


def test_draft_mtp_without_n_max_takes_llama_cpp_default() -> None:
    result = _llama("--model", "t.gguf", "--spec-type", "draft-mtp")
    assert result.findings == [] and result.spec.k == 3 and result.spec.model.text == "t.gguf"
    # -np left to llama-server: 4 slots over one unified KV cache; its batch defaults
    assert (result.spec.slots, result.spec.kv_unified, result.spec.batch, result.spec.ubatch) == (4, True, 2048, 512)


def test_llama_server_does_not_read_option_equals_value() -> None:
    result = _llama("--model=t.gguf", "-m", "t.gguf")
    [finding] = result.findings
    assert finding.code == "PWR440" and "`error: invalid argument: --model=t.gguf`" in finding.message
    assert "not `--option=VALUE`" in finding.hint


def test_unknown_flags_and_stray_words_stop_the_server() -> None:
    result = _llama("-m", "t.gguf", "--no-such-flag", "-cd", "4096", "--jinja")
    assert [(f.code, f.source_line[f.col - 1:].split()[0]) for f in result.findings] == [
        ("PWR440", "--no-such-flag"), ("PWR440", "-cd"), ("PWR440", "4096")]
    assert "draft context is built at the target's context size" in result.findings[1].hint
    assert "stray word" in result.findings[2].hint


@pytest.mark.parametrize("flag", ["-c", "--spec-draft-n-max"])
def test_an_option_without_its_value_is_a_finding(flag):
    result = _llama("-m", "t.gguf", "--spec-type", "draft-mtp", flag)
    [finding] = result.findings
    assert finding.code == "PWR441" and finding.source_line[finding.col - 1:] == flag
    assert f'error while handling argument "{flag}": expected value for argument' in finding.message


def test_slots_unified_kv_batches_and_the_ngram_window_are_read() -> None:
    result = _llama("-m", "t.gguf", "-np", "2", "-b", "1024", "-ub", "256", "--spec-type", "ngram-mod",
                    "--spec-ngram-mod-n-match", "16", "--spec-ngram-mod-n-min", "8")
    assert result.findings == []
    spec = result.spec
    assert (spec.slots, spec.kv_unified, spec.batch, spec.ubatch) == (2, False, 1024, 256)
    # n-gram alone drafts up to its n-max (llama.cpp's default 64): that is the proposal width K
    assert (spec.mode, spec.ngram_match, spec.ngram_draft_min, spec.ngram_draft_max, spec.k) == ("ngram", 16, 8, 64, 64)
    assert _llama("-m", "t.gguf", "-np", "2", "--kv-unified").spec.kv_unified is True
    assert _llama("-m", "t.gguf", "--no-kv-unified").spec.kv_unified is False


def test_none_in_a_spec_type_list_turns_speculation_off() -> None:
    result = _llama("-m", "t.gguf", "--spec-type", "ngram-mod,none")
    assert _codes(result) == ["PWR455"] and "drops every other type" in result.findings[0].message
    assert result.spec.mode == "none"


def test_no_model_is_a_finding() -> None:
    # the repository is named as a model to download (PWR447, with the fix), and the line has no local model
    assert _codes(_llama("-hf", "org/repo:Q4_K_M")) == ["PWR447", "PWR458"]


def test_unknown_and_unadapted_types() -> None:
    assert _codes(_llama("-m", "t.gguf", "--spec-type", "draft-magic")) == ["PWR455"]
    [eagle3] = _llama("-m", "t.gguf", "--spec-type", "draft-eagle3", "-md", "e.gguf").findings
    assert eagle3.code == "PWR455" and "draft-eagle3 loads a GGUF converted from the checkpoint" in eagle3.message


def test_env_file_variables_are_flags_and_keep_their_line(tmp_path: Path) -> None:
    env = tmp_path / "qwen.env"
    env.write_text("# served by llama-server\nLLAMA_ARG_MODEL=/m/t.gguf\nLLAMA_ARG_SPEC_TYPE=mtp\n"
                   "LLAMA_ARG_DRAFT_MAX=7\nEXTRA_ARGS=\"--spec-draft-n-max 4 -c 65536\"\n")
    result = import_launch(LLAMA_SERVER, tokens_from_env_file(env, env_names(LLAMA_SERVER)))
    assert [(f.code, f.line) for f in result.findings] == [("PWR450", 3), ("PWR454", 4)]
    # the variable reaches the same removal handler as the flag: llama-server stops at start
    assert ('`error while handling environment variable "LLAMA_ARG_DRAFT_MAX": the argument has been removed. '
            'use --spec-draft-n-max or --spec-ngram-mod-n-max`') in result.findings[1].message
    assert 'error while handling environment variable "LLAMA_ARG_SPEC_TYPE": unknown speculative type: mtp' in \
        result.findings[0].message
    assert result.findings[0].file == str(env)
    assert (result.spec.k, result.spec.ctx, result.spec.model.text) == (4, 65536, "/m/t.gguf")


def test_systemd_unit_with_continuations_and_environment(tmp_path: Path) -> None:
    (tmp_path / "extra.env").write_text("LLAMA_ARG_CTX_SIZE=131072\n")
    unit = tmp_path / "llama.service"
    unit.write_text("[Unit]\nDescription=qwen\n\n[Service]\nEnvironment=\"LLAMA_ARG_SPEC_DRAFT_N_MAX=3\"\n"
                    "EnvironmentFile=-extra.env\nEnvironmentFile=-missing.env\n"
                    "ExecStart=/opt/llama/llama-server -m /m/t.gguf \\\n"
                    "    -md /m/d.gguf \\\n"
                    "    --spec-type draft-mtp,draft-dspark\n"
                    "Restart=always\n")
    result = import_launch(LLAMA_SERVER, tokens_from_systemd_unit(unit, env_names(LLAMA_SERVER)))
    [finding] = result.findings
    assert (finding.code, finding.line) == ("PWR452", 10)
    assert finding.source_line[finding.col - 1:].startswith("draft-mtp,draft-dspark")
    assert (result.spec.k, result.spec.ctx) == (3, 131072)


def test_vllm_removed_flags_and_speculative_config() -> None:
    old = import_launch(VLLM, tokens_from_argv(["vllm", "serve", "t.gguf", "--speculative-model", "d",
                                                 "--num-speculative-tokens", "5"]))
    assert _codes(old) == ["PWR456", "PWR456"]
    new = import_launch(VLLM, tokens_from_argv([
        "vllm", "serve", "t.gguf", "--max-model-len", "4096",
        "--speculative-config", '{"method": "dspark", "model": "d.gguf", "num_speculative_tokens": 15}']))
    assert new.findings == []
    assert (new.spec.mode, new.spec.k, new.spec.ctx, new.spec.draft_model.text) == ("dspark", 15, 4096, "d.gguf")
    broken = import_launch(VLLM, tokens_from_argv(["vllm", "serve", "t.gguf", "--speculative-config", "{method: x"]))
    assert _codes(broken) == ["PWR457"]


def test_a_fractional_number_of_speculative_tokens_is_a_finding() -> None:
    config = '{"method": "ngram", "num_speculative_tokens": "3.5"}'
    result = import_launch(VLLM, tokens_from_argv(["vllm", "serve", "t.gguf", "--speculative-config", config]))
    assert _codes(result) == ["PWR459"]
    assert "expected a whole number, found '3.5'" in result.findings[0].message
    assert result.spec.k is None


def test_a_drafter_without_a_sliding_window_at_a_large_context(tmp_path: Path) -> None:
    dspark, dflash = build_dspark_drafter(tmp_path), build_dflash_drafter(tmp_path)
    large = _llama("-m", "t.gguf", "-md", str(dspark), "--spec-type", "draft-dspark", "-c", "262144")
    [finding] = large.findings
    assert (finding.code, finding.severity.value) == ("PWR453", "warning")
    assert "262,144 positions" in finding.message
    assert finding.source_line[finding.col - 1:].startswith(str(dspark))
    assert _llama("-m", "t.gguf", "-md", str(dspark), "--spec-type", "draft-dspark", "-c", "4096").findings == []
    assert _llama("-m", "t.gguf", "-md", str(dflash), "--spec-type", "draft-dflash", "-c", "262144").findings == []
    remote = _llama("-m", "t.gguf", "-md", "/srv/models/dspark.gguf", "--spec-type", "draft-dspark", "-c", "131072")
    [by_contract] = remote.findings
    assert by_contract.code == "PWR453" and "the contract has none" in by_contract.message


def test_cli_converts_a_clean_launch_into_checked_manifest_and_profile(tmp_path: Path) -> None:
    target, drafter = build_dense_target(tmp_path), build_dflash_drafter(tmp_path)
    out = tmp_path / "imported"
    result = CliRunner().invoke(main, ["import", "llama-server", "-o", str(out), "--json", "--device", "8 GiB", "--",
                                       "llama-server", "-m", str(target), "-md", str(drafter),
                                       "--spec-type", "draft-dflash,ngram-mod", "--spec-draft-n-max", "3", "-c",
                                       "2048"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert [f["code"] for f in report["findings"]] == ["PWR218"]  # info: the n-gram chain in front of DFlash
    manifest = (out / "manifest.toml").read_text()
    assert 'kind = "dflash"' in manifest and 'kind = "ngram"' in manifest
    assert (
        report["documents"]["manifest"]["target"]["sha256"]
        == report["documents"]["manifest"]["drafters"][0]["target_sha256"]
    )
    profile = (out / "profile.toml").read_text()
    assert 'spec_mode = "dflash"' in profile and "spec_draft_max = 3" in profile and "ctx = 2048" in profile
    plan = report["documents"]["plan"]
    assert (plan["verdict"], plan["mode"], plan["k"], plan["s"], plan["rollback"]) == ("fits", "dflash", 3, 3, "full")
    assert plan["chain"] == ["ngram", "dflash"]


def test_cli_refuses_to_write_a_broken_launch(tmp_path: Path) -> None:
    target = build_dense_target(tmp_path)
    out = tmp_path / "imported"
    result = CliRunner().invoke(main, ["import", "llama-server", "-o", str(out), "--",
                                       "-m", str(target), "--spec-type", "mtp"])
    assert result.exit_code == 1
    assert "PWR450" in result.output and "<command line>:1:" in result.output
    assert not (out / "manifest.toml").exists()


def test_cli_reads_a_systemd_unit_and_rejects_two_sources(tmp_path: Path) -> None:
    unit = tmp_path / "llama.service"
    unit.write_text("[Service]\nExecStart=/usr/bin/llama-server -m /m/t.gguf --draft-max 4\n")
    result = CliRunner().invoke(main, ["import", "llama-server", "--unit", str(unit)])
    assert result.exit_code == 1 and f"{unit}:2:" in result.output and "PWR454" in result.output
    both = CliRunner().invoke(main, ["import", "llama-server", "--unit", str(unit), "--", "-m", "x.gguf"])
    assert both.exit_code == 2


def test_cli_needs_the_model_files_here_to_write_a_manifest(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["import", "vllm", "-o", str(tmp_path / "out"), "--",
                                       "vllm", "serve", "Qwen/Qwen3.6-27B", "--speculative-config",
                                       '{"method": "mtp", "num_speculative_tokens": 2}'])
    assert result.exit_code == 1 and "PWR458" in result.output and "Qwen/Qwen3.6-27B is not a file" in result.output
    assert not (tmp_path / "out" / "manifest.toml").exists()


def test_cli_compiles_the_import_and_reports_what_the_checks_find(tmp_path: Path) -> None:
    target, drafter = build_dense_target(tmp_path), build_dflash_drafter(tmp_path)
    result = CliRunner().invoke(main, ["import", "llama-server", "-o", str(tmp_path / "out"), "--device", "8 GiB", "--",
                                       "-m", str(target), "-md", str(drafter), "--spec-type", "draft-dflash",
                                       "--spec-draft-n-max", "16"])
    assert result.exit_code == 1
    assert "PWR425" in result.output and "proposes at most 3 tokens per block" in result.output
    assert not (tmp_path / "out").exists()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12),
                min_size=1, max_size=8))
def test_every_argv_token_points_at_its_own_quoted_word(argv: list[str]) -> None:
    tokens = tokens_from_argv(argv)
    assert [token.text for token in tokens] == argv
    line = tokens[0].source_line
    for token in tokens:
        quoted = shlex.quote(token.text)
        assert line[token.col - 1:token.col - 1 + len(quoted)] == quoted
    assert shlex.split(line) == argv


@pytest.mark.parametrize("method, mode", [("qwen3_5_mtp", "mtp"), ("deepseek_mtp", "mtp"), ("ngram_gpu", "ngram")])
def test_vllm_methods_power_runs_under_another_name(method, mode):
    config = json.dumps({"method": method, "num_speculative_tokens": 3, "prompt_lookup_min": 4, "prompt_lookup_max": 4})
    result = import_launch(VLLM, tokens_from_argv(["vllm", "serve", "t.gguf", "--speculative-config", config]))
    assert result.findings == [] and result.spec.mode == mode


def test_vllm_methods_without_a_power_adapter_are_named_not_unknown():
    config = json.dumps({"method": "suffix", "num_speculative_tokens": 8})
    [finding] = import_launch(VLLM, tokens_from_argv(["vllm", "serve", "t.gguf", "--speculative-config",
                                                      config])).findings
    assert finding.code == "PWR455" and "no adapter for the vLLM method 'suffix'" in finding.message


def test_vllm_retired_swap_space_is_flagged():
    result = import_launch(VLLM, tokens_from_argv(["vllm", "serve", "t.gguf", "--swap-space", "16", "--max-num-seqs",
                                                   "8"]))
    [finding] = result.findings
    assert finding.code == "PWR456" and "--swap-space" in finding.message and "--kv-offloading-size" in finding.hint
    assert result.spec.slots == 8


def test_a_variable_the_unit_does_not_define_is_a_finding_and_defined_ones_expand(tmp_path: Path) -> None:
    unit = tmp_path / "llama.service"
    unit.write_text('[Service]\nEnvironment="MODEL=/m/t.gguf" "SPEC=--spec-type draft-mtp"\n'
                    "ExecStart=/usr/bin/llama-server -m ${MODEL} $SPEC -c $CTX\n")
    result = import_launch(LLAMA_SERVER, tokens_from_systemd_unit(unit, env_names(LLAMA_SERVER)))
    assert result.spec.model.text == "/m/t.gguf" and result.spec.mode == "mtp"
    unresolved = [f for f in result.findings if f.code == "PWR442"]
    assert len(unresolved) == 1 and "$CTX" in unresolved[0].message and unresolved[0].line == 3


def test_an_unknown_llama_arg_variable_is_ignored_by_llama_server_and_said(tmp_path: Path) -> None:
    env = tmp_path / "qwen.env"
    env.write_text("LLAMA_ARG_MODEL=/m/t.gguf\nLLAMA_ARG_N_CTX=8192\n")
    result = import_launch(LLAMA_SERVER, tokens_from_env_file(env, env_names(LLAMA_SERVER)))
    [finding] = result.findings
    assert (finding.code, finding.line, finding.severity.value) == ("PWR443", 2, "warning")
    assert "LLAMA_ARG_N_CTX" in finding.message


def test_an_unbalanced_quote_in_a_flag_list_is_a_located_input_error(tmp_path: Path) -> None:
    env = tmp_path / "qwen.env"
    env.write_text("LLAMA_ARG_MODEL=/m/t.gguf\nEXTRA_ARGS=\"--alias 'qwen\"\n")
    result = CliRunner().invoke(main, ["import", "llama-server", "--env-file", str(env)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"{env}:2:" in result.output and "balance its quotes" in result.output


def test_an_ngram_only_launch_imports_a_manifest_with_its_ngram_drafter_and_plans(tmp_path: Path) -> None:
    target = build_dense_target(tmp_path)
    out = tmp_path / "imported"
    result = CliRunner().invoke(main, ["import", "llama-server", "-o", str(out), "--json", "--device", "8 GiB", "--",
                                       "-m", str(target), "--spec-type", "ngram-mod", "-np", "1", "-c", "2048",
                                       "--spec-ngram-mod-n-min", "8", "--spec-ngram-mod-n-max", "16"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["documents"]["manifest"]["drafters"] == [{"kind": "ngram"}]
    profile = report["documents"]["profile"]
    # what llama-server runs: n-match 24 by default; the longest draft 16 is the proposal width
    assert profile["spec_draft_max"] == 16 and profile["runtime"]["ngram_match"] == 24
    assert report["documents"]["plan"]["chain"] == ["ngram"]
    # n-max below llama.cpp's default n-min (48): every draft is dropped, and the import says so
    never = CliRunner().invoke(main, ["import", "llama-server", "-o", str(tmp_path / "never"), "--",
                                      "-m", str(target), "--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "16"])
    assert never.exit_code == 1 and "PWR411" in never.output and "never proposes" in never.output
    assert not (tmp_path / "never").exists()


def test_nothing_is_written_when_the_written_files_do_not_compile(tmp_path: Path) -> None:
    target = build_dense_target(tmp_path)
    out = tmp_path / "imported"
    result = CliRunner().invoke(main, ["import", "llama-server", "-o", str(out), "--device", "1 MiB", "--",
                                       "-m", str(target), "--spec-type", "draft-mtp"])
    assert result.exit_code == 1 and "PWR212" in result.output  # the dense target carries no MTP head
    assert not out.exists() and not list(tmp_path.glob(".imported.import-*"))
    # told at the flag that asked for the drafter, not in a manifest that is never written
    assert "<command line>:1:" in result.output and "manifest.toml" not in result.output
    assert "--spec-type draft-mtp\n" in result.output and "add " not in result.output


def test_an_mtp_only_draft_model_imports_as_the_targets_sidecar(tmp_path: Path) -> None:
    target, sidecar = build_headless_hybrid_target(tmp_path), build_mtp_sidecar(tmp_path)
    out = tmp_path / "imported"
    result = CliRunner().invoke(main, ["import", "llama-server", "-o", str(out), "--json", "--device", "8 GiB", "--",
                                       "-m", str(target), "--spec-draft-model", str(sidecar), "--spec-type",
                                       "draft-mtp",
                                       "--spec-draft-n-max", "2", "-np", "1", "-c", "2048"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    [drafter] = report["documents"]["manifest"]["drafters"]
    assert drafter["kind"] == "mtp" and drafter["path"].endswith("mtp-sidecar.gguf")
    assert drafter["target_sha256"] == report["documents"]["manifest"]["target"]["sha256"]
    assert report["documents"]["plan"]["mode"] == "mtp"


def _import_unit(unit: Path):
    started = time.monotonic()
    result = CliRunner().invoke(main, ["import", "llama-server", "--unit", str(unit)])
    return result, time.monotonic() - started


def test_unit_expansion_is_bounded_in_size_files_and_value_length(tmp_path: Path) -> None:
    """Issue 26 item 4: `$A` repeated, thousands of EnvironmentFile= lines and one huge value are refused in
    moments (PWR459, located), never expanded into gigabytes."""
    value = "x" * 60_000
    multiplied = tmp_path / "multiplied.service"
    multiplied.write_text(f"[Service]\nEnvironment=A={value}\nExecStart=/usr/bin/llama-server \\\n"
                          + ("$A ${A} " * 1000 + "\\\n") * 100 + "--end\n")
    env = tmp_path / "one.env"
    env.write_text("B=1\n")
    many_files = tmp_path / "many.service"
    many_files.write_text("[Service]\n" + f"EnvironmentFile={env}\n" * 2000 + "ExecStart=/usr/bin/llama-server\n")
    huge_value = tmp_path / "huge.service"
    huge_value.write_text(
        '[Service]\nEnvironment="ARGS=' + "-x " * 300_000 + '"\nExecStart=/usr/bin/llama-server $ARGS\n'
    )
    for unit, says in ((multiplied, "expands past"), (many_files, "EnvironmentFile= lines"),
                       (huge_value, "a line may have at most")):
        result, took = _import_unit(unit)
        assert result.exit_code == 2 and "PWR459" in result.output and says in result.output, result.output
        assert f"{unit}:" in result.output and took < 10


def test_a_model_file_that_is_not_a_gguf_is_a_finding_at_its_flag(tmp_path: Path) -> None:
    """Issue 26 (low): `import -m /etc/passwd` reported 0 findings."""
    text_file = tmp_path / "passwd"
    text_file.write_text("root:x:0:0:root:/root:/bin/bash\n")
    result = CliRunner().invoke(main, ["import", "llama-server", "--json", "--", "-m", str(text_file)])
    assert result.exit_code == 1, result.output
    [finding] = [f for f in json.loads(result.stdout)["findings"] if f["code"] == "PWR102"]
    assert finding["file"] == COMMAND_LINE and str(text_file) in finding["message"]


def test_flash_attention_auto_imports_as_auto_and_sizes_and_renders_as_llama_server_runs_it(tmp_path: Path) -> None:
    """Issue 40 (noticed): `-fa auto` (llama.cpp's default, also with no -fa) imported as flash_attn = false, which
    sizes the V cache and the attention's compute without flash attention. llama.cpp builds the context for flash
    attention under auto and keeps it where the device runs it (src/llama-context.cpp): the profile says "auto", the
    plan sizes it as `-fa on` does, and the render gives llama-server `-fa auto` back."""
    assert (_llama("-m", "t.gguf", "-fa", "auto").spec.flash_attn, _llama("-m", "t.gguf", "-fa",
                                                                          "enabled").spec.flash_attn,
            _llama("-m", "t.gguf", "-fa", "0").spec.flash_attn) == ("auto", True, False)
    assert _codes(_llama("-m", "t.gguf", "-fa", "maybe")) == ["PWR459"]
    target = build_dense_target(tmp_path)
    plans = {}
    for value in ("auto", "on", "off", "default"):  # default: no -fa, which is auto to llama-server
        out = tmp_path / value
        flag = ["-fa", value] if value != "default" else []
        imported = CliRunner().invoke(main, ["import", "llama-server", "-o", str(out), "--device", "8 GiB", "--",
                                             "llama-server", "-m", str(target), "-c", "2048", *flag])
        assert imported.exit_code == 0, imported.output
        planned = CliRunner().invoke(main, ["plan", str(out / "manifest.toml"), str(out / "profile.toml"), "--device",
                                            "8 GiB", "--engine", "llama-server", "--json"])
        assert planned.exit_code == 0, planned.output
        plans[value] = json.loads(planned.stdout)
    assert 'flash_attn = "auto"' in (tmp_path / "auto" / "profile.toml").read_text()
    assert plans["auto"]["runtime"]["flash_attn"] == plans["default"]["runtime"]["flash_attn"] == "auto"
    assert plans["auto"]["memory"]["devices"] == plans["on"]["memory"]["devices"] != plans["off"]["memory"]["devices"]
    (tmp_path / "auto.plan.json").write_text(json.dumps(plans["auto"]))
    rendered = CliRunner().invoke(main, ["render", str(tmp_path / "auto.plan.json"), "--target", "llama-server"])
    assert rendered.exit_code == 0, rendered.output
    words = rendered.stdout.split()
    assert words[words.index("-fa") + 1] == "auto"
