"""`power import`: existing llama-server / vLLM launches read into Power terms, each known mistake a located finding."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from power.artifacts.factory import build_dense_target, build_dflash_drafter, build_dspark_drafter
from power.orchestrator.cli import main
from power.orchestrator.launch_import import LLAMA_SERVER, VLLM, import_launch
from power.orchestrator.launch_tokens import (
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
    assert result.findings[0].hint == "use --spec-draft-n-max"
    assert result.findings[1].hint == "use --spec-draft-n-min"
    assert "invalid argument: --draft-max" in result.findings[0].message


def test_a_legal_chain_reads_cleanly_into_power_terms() -> None:
    result = _llama("-m", "t.gguf", "-md", "d.gguf", "--spec-type", "draft-dflash,ngram-mod",
                    "--spec-draft-n-max", "15", "-c", "8192", "-fa", "on", "--jinja", "-ctk", "q8_0")
    assert result.findings == []
    spec = result.spec
    assert (spec.mode, spec.chain, spec.k, spec.ctx) == ("dflash", ["ngram", "dflash"], 15, 8192)
    assert spec.model.text == "t.gguf" and spec.draft_model.text == "d.gguf"
    assert spec.flash_attn is True and spec.kv_cache_type == "q8_0"


def test_draft_mtp_without_n_max_takes_llama_cpp_default() -> None:
    result = _llama("--model=t.gguf", "--spec-type=draft-mtp")
    assert result.findings == [] and result.spec.k == 3 and result.spec.model.text == "t.gguf"


def test_no_model_is_a_finding() -> None:
    assert _codes(_llama("-hf", "org/repo:Q4_K_M")) == ["PWR458"]


def test_unknown_and_unadapted_types() -> None:
    assert _codes(_llama("-m", "t.gguf", "--spec-type", "draft-magic")) == ["PWR455"]
    assert _codes(_llama("-m", "t.gguf", "--spec-type", "draft-eagle3", "-md", "e.gguf")) == ["PWR455"]


def test_env_file_variables_are_flags_and_keep_their_line(tmp_path: Path) -> None:
    env = tmp_path / "qwen.env"
    env.write_text("# served by llama-server\nLLAMA_ARG_MODEL=/m/t.gguf\nLLAMA_ARG_SPEC_TYPE=mtp\n"
                   "LLAMA_ARG_DRAFT_MAX=7\nEXTRA_ARGS=\"--spec-draft-n-max 4 -c 65536\"\n")
    result = import_launch(LLAMA_SERVER, tokens_from_env_file(env, "LLAMA_ARG_"))
    assert [(f.code, f.line) for f in result.findings] == [("PWR450", 3), ("PWR454", 4)]
    assert "LLAMA_ARG_DRAFT_MAX" in result.findings[1].message and "ignores it" in result.findings[1].message
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
    result = import_launch(LLAMA_SERVER, tokens_from_systemd_unit(unit, "LLAMA_ARG_"))
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
                                       "--spec-type", "draft-dflash,ngram-mod", "--spec-draft-n-max", "3", "-c", "2048"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert [f["code"] for f in report["findings"]] == ["PWR218"]  # info: the n-gram chain in front of DFlash
    manifest = (out / "manifest.toml").read_text()
    assert 'kind = "dflash"' in manifest and 'kind = "ngram"' in manifest
    assert report["documents"]["manifest"]["target"]["sha256"] == report["documents"]["manifest"]["drafters"][0]["target_sha256"]
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
