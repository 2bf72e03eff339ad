"""Every schema rule that needs no artifact, through the loader on real TOML files."""

import re
from pathlib import Path

import pytest
from toml_helpers import MANIFEST_HEAD, PROFILE_HEAD, SHA_A, SHA_B, codes, write

from power.findings import Severity
from power.orchestrator.inputs.loading import load_fleet, load_host, load_manifest, load_profile
from power.orchestrator.inputs.schema import KIND_MODELS, Profile, json_schema
from power.orchestrator.inputs.units import SizeError, parse_size


def profile(tmp_path: Path, body: str):
    return load_profile(write(tmp_path, "p.toml", PROFILE_HEAD + body))


def only(loaded, code):
    found = [finding for finding in loaded.findings if finding.code == code]
    assert len(found) == 1, loaded.findings
    return found[0]


def test_a_minimal_profile_takes_the_documented_defaults(tmp_path):
    loaded = profile(tmp_path, "")
    assert loaded.ok and loaded.findings == []
    model: Profile = loaded.model
    assert model.spec_mode == "auto"
    assert (model.spec_draft_max, model.spec_mtp_recurrent_snapshots, model.spec_mtp_fr_vocab_size) == (7, 7, None)
    assert model.runtime.gpu_layers == "all" and model.runtime.verify_capacity is None
    assert model.verify_rows == 8
    assert model.sampling.verify == "match"


def test_unknown_key_suggests_the_closest_allowed_key(tmp_path):
    loaded = profile(tmp_path, "[runtime]\nctx = 512\nverify_capacty = 11\n")
    finding = only(loaded, "PWR020")
    assert (finding.line, finding.col) == (5, 1)
    assert finding.hint == "did you mean `verify_capacity`?"
    assert "[runtime]" in finding.message
    assert loaded.model is None


def test_unknown_key_without_a_close_match_lists_the_allowed_keys(tmp_path):
    finding = only(profile(tmp_path, "colour = 3\n"), "PWR020")
    assert "spec_draft_max" in finding.hint and "allowed keys" in finding.hint


def test_llama_cpp_spelling_of_a_key_names_powers_key(tmp_path):
    finding = only(profile(tmp_path, 'spec_type = "mtp"\n'), "PWR026")
    assert finding.hint == "rename `spec_type` to `spec_mode`"


def test_llama_cpp_spec_type_value_names_powers_mode(tmp_path):
    finding = only(profile(tmp_path, 'spec_mode = "draft-mtp"\n'), "PWR022")
    assert '"mtp"' in finding.hint


@pytest.mark.parametrize(
    ("body", "code", "where"),
    [
        ("spec_draft_max = 0\n", "PWR401", "spec_draft_max"),
        ("spec_draft_max = 65\n", "PWR401", "spec_draft_max"),
        ('spec_draft_max = "7"\n', "PWR401", "spec_draft_max"),
        ("spec_mtp_recurrent_snapshots = 0\n", "PWR402", "spec_mtp_recurrent_snapshots"),
        ('spec_mode = "mtp"\nspec_mtp_fr_vocab_size = 0\n', "PWR403", "spec_mtp_fr_vocab_size"),
        ('spec_mode = "mtp"\nspec_mtp_fr_vocab_size = "big"\n', "PWR403", "spec_mtp_fr_vocab_size"),
        ('spec_mode = "mtp"\nspec_mtp_fr_vocab_size = 8192.5\n', "PWR403", "spec_mtp_fr_vocab_size"),
        ("[sampling]\ntemperature = -0.5\n", "PWR409", "sampling.temperature"),
        ("spec_mtp_adaptive = 1\n", "PWR022", "spec_mtp_adaptive"),
        ('[runtime]\nctx = "4k"\n', "PWR022", "runtime.ctx"),
        ("[runtime]\ngpu_layers = -1\n", "PWR022", "runtime.gpu_layers"),
        ('[sampling]\nverify = "exact"\n', "PWR022", "sampling.verify"),
        ('spec_mode = "medusa"\n', "PWR022", "spec_mode"),
    ],
)
def test_field_ranges_and_types(tmp_path, body, code, where):
    loaded = profile(tmp_path, body)
    finding = only(loaded, code)
    assert finding.where == where and finding.severity is Severity.ERROR
    assert finding.line is not None and finding.hint
    assert loaded.model is None


@pytest.mark.parametrize("mode", ["ngram", "none", "draft-model"])
def test_fr_is_an_error_for_a_mode_without_a_draft_head(tmp_path, mode):
    finding = only(profile(tmp_path, f'spec_mode = "{mode}"\nspec_mtp_fr_vocab_size = 8192\n'), "PWR404")
    assert finding.severity is Severity.ERROR and (finding.line, finding.col) == (4, 26)


def test_fr_with_a_draft_head_is_fine_and_with_auto_is_an_info(tmp_path):
    for mode in ("mtp", "dflash", "dflash2", "dspark"):  # a block drafter drafts through the target's LM head
        assert profile(tmp_path, f'spec_mode = "{mode}"\nspec_mtp_fr_vocab_size = 8192\n').findings == []
    finding = only(profile(tmp_path, "spec_mtp_fr_vocab_size = 8192\n"), "PWR404")
    assert finding.severity is Severity.INFO


@pytest.mark.parametrize("mode", ["dflash2", "none", "ngram"])
def test_adaptive_with_a_mode_the_controller_does_not_drive_is_an_error(tmp_path, mode):
    finding = only(profile(tmp_path, f'spec_mode = "{mode}"\nspec_mtp_adaptive = true\n'), "PWR405")
    assert finding.where == "spec_mtp_adaptive"


@pytest.mark.parametrize("mode", ["mtp", "dflash", "dspark", "auto"])
def test_adaptive_with_mtp_dflash_dspark_or_auto_is_fine(tmp_path, mode):
    assert profile(tmp_path, f'spec_mode = "{mode}"\nspec_mtp_adaptive = true\n').findings == []


def test_draft_model_parses_but_is_flagged_as_reserved(tmp_path):
    loaded = profile(tmp_path, 'spec_mode = "draft-model"\n')
    finding = only(loaded, "PWR410")
    assert finding.severity is Severity.WARNING
    assert loaded.ok and loaded.model.spec_mode == "draft-model"


def test_s_below_k_is_the_guarded_path_and_s_above_k_is_unused_state(tmp_path):
    guarded = only(profile(tmp_path, "spec_draft_max = 7\nspec_mtp_recurrent_snapshots = 6\n"), "PWR406")
    assert guarded.severity is Severity.INFO and "guarded path: one exact replay then clamp to S" in guarded.message
    unused = only(profile(tmp_path, "spec_draft_max = 3\nspec_mtp_recurrent_snapshots = 7\n"), "PWR407")
    assert unused.severity is Severity.WARNING and "resident state never used" in unused.message
    assert profile(tmp_path,
                   'spec_mode = "none"\nspec_draft_max = 3\nspec_mtp_recurrent_snapshots = 7\n').findings == []


def test_verify_capacity_must_hold_the_anchor_and_k_proposals(tmp_path):
    head = "spec_draft_max = 10\nspec_mtp_recurrent_snapshots = 10\n[runtime]\n"
    finding = only(profile(tmp_path, head + "verify_capacity = 10\n"), "PWR408")
    assert (finding.line, finding.col) == (6, 19)
    assert "at least 11" in finding.hint
    assert profile(tmp_path, head + "verify_capacity = 11\n").findings == []


def test_ngram_window_must_not_be_empty(tmp_path):
    finding = only(profile(tmp_path, "[runtime]\nngram_draft_min = 6\nngram_draft_max = 4\n"), "PWR411")
    assert finding.where == "runtime.ngram_draft_min" and "ngram_draft_max = 4" in finding.message
    by_k = only(profile(tmp_path, "spec_draft_max = 3\n[runtime]\nngram_draft_min = 4\n"), "PWR411")
    assert "K (spec_draft_max = 3)" in by_k.message
    assert "PWR411" not in codes(profile(tmp_path, "spec_draft_max = 4\n[runtime]\nngram_draft_min = 4\n"))


def test_former_ngram_keys_name_their_successor(tmp_path):
    finding = only(profile(tmp_path, "[runtime]\nngram_n_min = 3\n"), "PWR026")
    assert finding.hint == "rename `ngram_n_min` to `ngram_match`"
    llama = only(profile(tmp_path, "[runtime]\nspec_ngram_mod_n_max = 64\n"), "PWR026")
    assert llama.hint == "rename `spec_ngram_mod_n_max` to `ngram_draft_max`"


def test_cross_field_rules_still_run_when_another_field_is_bad(tmp_path):
    loaded = profile(tmp_path, 'spec_mode = "ngram"\nspec_mtp_fr_vocab_size = 8192\n[runtime]\nctx = "big"\n')
    assert codes(loaded) == ["PWR404", "PWR022"]


# --- manifests ---------------------------------------------------------------------


def manifest(tmp_path: Path, drafters: str, target: str | None = None):
    target = target or f'[target]\npath = "t.gguf"\nsize = "1.5 GB"\nsha256 = "{SHA_A}"\n'
    return load_manifest(write(tmp_path, "sub/m.toml", MANIFEST_HEAD + target + drafters))


def test_manifest_paths_resolve_against_the_manifests_directory(tmp_path):
    loaded = manifest(tmp_path, '[[drafters]]\nkind = "dspark"\npath = "../d.gguf"\nsha256 = '
                                f'"{SHA_B}"\ntarget_sha256 = "{SHA_A}"\n')
    assert loaded.ok, loaded.findings
    assert loaded.model.target.path == (tmp_path / "sub" / "t.gguf").resolve()
    assert loaded.model.target.size == 1_500_000_000
    assert loaded.model.drafters[0].path == (tmp_path / "d.gguf").resolve()
    assert loaded.model.drafters[0].kind == "dspark"


def test_a_path_that_is_a_symlink_loop_is_a_located_finding(tmp_path):
    (tmp_path / "sub").mkdir(exist_ok=True)
    (tmp_path / "sub" / "loop.gguf").symlink_to(tmp_path / "sub" / "loop.gguf")
    loaded = manifest(tmp_path, "", target=f'[target]\npath = "loop.gguf"\nsha256 = "{SHA_A}"\n')
    assert not loaded.ok
    finding = next(f for f in loaded.findings if f.where == "target.path")
    assert "cannot be resolved" in finding.message and finding.code == "PWR022" and finding.line == 4


@pytest.mark.parametrize("kind", ["dflash", "dflash2", "dspark", "draft-model"])
def test_a_file_backed_drafter_needs_path_sha256_and_binding(tmp_path, kind):
    loaded = manifest(tmp_path, f'[[drafters]]\nkind = "mtp"\n[[drafters]]\nkind = "{kind}"\n')
    finding = only(loaded, "PWR025")
    assert finding.where == "drafters[1].kind" and (finding.line, finding.col) == (10, 8)
    assert "path, sha256 and target_sha256" in finding.message


@pytest.mark.parametrize(("kind", "stray", "reason"), [("mtp", "quant", "lives in the target file unless `path` names"),
                                                       ("ngram", "path", "needs no file")])
def test_mtp_and_ngram_drafters_name_no_file(tmp_path, kind, stray, reason):
    assert manifest(tmp_path, f'[[drafters]]\nkind = "{kind}"\n').findings == []
    finding = only(manifest(tmp_path, f'[[drafters]]\nkind = "{kind}"\n{stray} = "x"\n'), "PWR025")
    assert reason in finding.message and finding.where == f"drafters[0].{stray}"


def test_an_mtp_sidecar_is_a_bound_file(tmp_path):
    finding = only(manifest(tmp_path, '[[drafters]]\nkind = "mtp"\npath = "mtp-only.gguf"\n'), "PWR025")
    assert (
        "mtp drafter sidecar is a separate GGUF file" in finding.message
        and "sha256 and target_sha256" in finding.message
    )


def test_a_malformed_sha256_is_named(tmp_path):
    loaded = manifest(tmp_path, "", target='[target]\npath = "t.gguf"\nsha256 = "abc"\n')
    finding = only(loaded, "PWR024")
    assert (finding.line, finding.col) == (5, 10) and "sha256sum" in finding.hint


def test_a_missing_required_key_points_at_its_table(tmp_path):
    finding = only(manifest(tmp_path, "", target='[target]\npath = "t.gguf"\n'), "PWR021")
    assert finding.where == "target.sha256" and (finding.line, finding.col) == (3, 1)
    assert "sha256 = ..." in finding.hint


def test_a_missing_top_level_key_points_at_the_start_of_the_file(tmp_path):
    loaded = load_profile(write(tmp_path, "p.toml", '#:schema ../profile.json\nschema = "power.profile/v1"\n'))
    finding = only(loaded, "PWR021")
    assert (finding.where, finding.line, finding.col, finding.source_line) == ("name", 1, 1, "#:schema ../profile.json")


def test_a_bad_size_lists_the_accepted_forms(tmp_path):
    loaded = manifest(tmp_path, "", target=f'[target]\npath = "t.gguf"\nsize = "22 gigs"\nsha256 = "{SHA_A}"\n')
    finding = only(loaded, "PWR023")
    assert (finding.line, finding.col) == (5, 8) and '"24 GiB"' in finding.hint


# --- hosts and fleets -----------------------------------------------------------------


def test_host_sizes_and_defaults(tmp_path):
    loaded = load_host(write(tmp_path, "h.toml", 'schema = "power.host/v1"\nname = "h"\ndevices = [{ model = "RTX '
                                                 '4090", vram = "24 GiB" }]\n'))
    assert loaded.ok
    assert loaded.model.devices[0].vram == 24 * 1024**3
    assert loaded.model.headroom == 512 * 1024**2


def test_host_bad_unit_in_an_inline_table_is_located(tmp_path):
    path = write(tmp_path, "h.toml", 'schema = "power.host/v1"\nname = "h"\ndevices = [{ model = "RTX '
                                     '4090", vram = "24 Gb" }]\n')
    finding = only(load_host(path), "PWR023")
    assert finding.where == "devices[0].vram" and (finding.line, finding.col) == (3, 41)
    assert "bits" in finding.message


def test_fleet_with_inline_hosts_and_deployments(tmp_path):
    text = '''
        schema = "power.fleet/v1"
        [[hosts]]
        name = "gpu-a"
        devices = [{ model = "RTX 4090", vram = "24 GiB" }]
        headroom = "512 MiB"
        [[deployments]]
        host = "gpu-a"
        manifest = "../manifests/m.toml"
        profile = "../profiles/p.toml"
        traffic = "echo"
    '''
    loaded = load_fleet(write(tmp_path, "fleet/fleet.toml", text))
    assert loaded.ok, loaded.findings
    deployment = loaded.model.deployments[0]
    assert deployment.manifest == (tmp_path / "manifests" / "m.toml").resolve()
    assert deployment.traffic == "echo"
    assert loaded.model.hosts[0].devices[0].vram == 24 * 1024**3


def test_fleet_errors_in_the_second_host_are_located_there(tmp_path):
    text = '''
        schema = "power.fleet/v1"
        [[hosts]]
        name = "a"
        devices = [{ model = "x", vram = "1 GiB" }]
        [[hosts]]
        name = "b"
        devices = [{ model = "y", vrma = 2 }]
        [[deployments]]
        host = "a"
        manifest = "m.toml"
        profile = "p.toml"
        traffic = "chat"
    '''
    loaded = load_fleet(write(tmp_path, "fleet.toml", text))
    assert codes(loaded) == ["PWR021", "PWR020", "PWR022"]
    missing, unknown, traffic = loaded.findings
    assert (unknown.line, unknown.col, unknown.hint) == (7, 27, "did you mean `vram`?")
    assert missing.where == "hosts[1].devices[0].vram" and missing.line == 7
    assert traffic.where == "deployments[0].traffic" and traffic.line == 12


def test_json_schemas_forbid_unknown_keys_and_pin_the_schema_line():
    for kind in KIND_MODELS:
        schema = json_schema(kind)
        assert schema["additionalProperties"] is False
        assert schema["properties"]["schema"]["const"] == f"power.{kind}/v1"
        assert "schema" in schema["required"]
    size = json_schema("host")["$defs"]["DeviceSpec"]["properties"]["vram"]
    assert {alternative["type"] for alternative in size["anyOf"]} == {"integer", "string"}


@pytest.mark.parametrize("text", ["24 GiB", "512MiB", "1.5 GB", "17 B", "1_140_000_000", "250 kB", "24 G", "24 Gb",
                                  "3 XB", "lots"])
def test_the_json_schemas_size_pattern_agrees_with_the_parser(text):
    pattern = json_schema("host")["$defs"]["DeviceSpec"]["properties"]["vram"]["anyOf"][1]["pattern"]
    try:
        parse_size(text)
        parsed = True
    except SizeError:
        parsed = False
    assert (re.match(pattern, text) is not None) == parsed


def test_a_name_with_a_control_character_is_a_finding(tmp_path):
    """Issue 26 (low): a NUL in a manifest name broke the systemd drop-in; a line break ends a comment."""
    from click.testing import CliRunner

    from power.app.cli import main

    manifest = tmp_path / "m.toml"
    manifest.write_text('schema = "power.manifest/v1"\nname = "a\\u0000b"\n[target]\npath = "t.gguf"\n')
    result = CliRunner().invoke(main, ["validate", str(manifest)])
    assert result.exit_code == 1 and "m.toml:2:8: PWR022" in result.output and "\x00" not in result.output
