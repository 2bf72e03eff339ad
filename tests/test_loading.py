"""Bad input never raises: each gives one clear finding naming the file; located findings for later checks."""

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toml_helpers import MANIFEST_HEAD, PROFILE_HEAD, SHA_A, codes, toml_key, toml_value, write

from power.findings import Severity
from power.orchestrator.inputs.loading import MAX_TOML_BYTES, load_document, load_manifest, load_profile
from power.orchestrator.inputs.schema import KIND_MODELS


def single(loaded, code):
    assert codes(loaded) == [code], loaded.findings
    finding = loaded.findings[0]
    assert finding.file == str(loaded.path) and finding.severity is Severity.ERROR and finding.hint
    assert loaded.model is None and not loaded.ok
    return finding


def test_missing_path(tmp_path):
    single(load_document(tmp_path / "nope.toml"), "PWR001")


def test_directory(tmp_path):
    assert "directory" in single(load_document(tmp_path), "PWR002").message


def test_fifo_is_refused_without_opening_it(tmp_path):
    fifo = tmp_path / "pipe.toml"
    os.mkfifo(fifo)
    assert "FIFO" in single(load_document(fifo), "PWR002").message


def test_character_device():
    single(load_document("/dev/null"), "PWR002")


def test_empty_and_blank_files(tmp_path):
    single(load_document(write(tmp_path, "empty.toml", "")), "PWR004")
    single(load_document(write(tmp_path, "blank.toml", "\n  \n\t\n")), "PWR004")


def test_binary_file(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(range(256)))
    single(load_document(path), "PWR005")


def test_non_utf8_bytes_are_located(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes('schema = "power.profile/v1"\nname = "caf\xe9"\n'.encode("latin-1"))
    finding = single(load_document(path), "PWR006")
    assert (finding.line, finding.col) == (2, 12)
    assert "0xe9" in finding.message


def test_deeply_nested_array(tmp_path):
    path = write(tmp_path, "deep.toml", "a = " + "[" * 2000 + "]" * 2000 + "\n")
    single(load_document(path), "PWR008")


def test_a_50_mb_file_is_refused_before_reading(tmp_path):
    path = tmp_path / "huge.toml"
    with open(path, "wb") as handle:
        handle.truncate(50 * 1024**2)
    finding = single(load_document(path), "PWR003")
    assert f"{MAX_TOML_BYTES:,}" in finding.message


def test_syntax_error_has_tomlis_line_and_column_and_the_source_line(tmp_path):
    path = write(tmp_path, "bad.toml", PROFILE_HEAD + "spec_draft_max = = 7\n")
    finding = single(load_document(path), "PWR007")
    assert (finding.line, finding.col) == (3, 18)
    assert finding.source_line == "spec_draft_max = = 7"
    assert finding.render().splitlines()[2].index("^") == len("  3 | ") + 17


def test_missing_schema(tmp_path):
    finding = single(load_document(write(tmp_path, "m.toml", 'name = "x"\n')), "PWR010")
    assert 'schema = "power.manifest/v1"' in finding.hint and finding.line == 1


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ('"power.profil/v1"', 'did you mean schema = "power.profile/v1"?'),
        ('"power.profile/v2"', 'did you mean schema = "power.profile/v1"?'),
        ('"something else"', '"power.manifest/v1"'),
        ("3", '"power.manifest/v1"'),
    ],
)
def test_wrong_schema(tmp_path, value, hint):
    finding = single(load_document(write(tmp_path, "x.toml", f"# comment\nschema = {value}\n")), "PWR011")
    assert (finding.line, finding.col) == (2, 10)
    assert hint in finding.hint


def test_a_document_power_generates_is_recognised_not_validated(tmp_path):
    loaded = load_document(write(tmp_path, "x.plan.toml", 'schema = "power.plan/v1"\ndigest = "abc"\n'))
    assert codes(loaded) == ["PWR014"] and loaded.findings[0].severity is Severity.INFO
    assert loaded.model is None and loaded.kind == "plan"
    as_manifest = load_manifest(loaded.path)
    assert codes(as_manifest) == ["PWR014", "PWR012"] and as_manifest.findings[1].severity is Severity.ERROR


def test_an_editor_schema_line_naming_another_kind_is_a_warning(tmp_path):
    loaded = load_document(write(tmp_path, "p.toml",
                                 "#:schema ../power/orchestrator/schemas/manifest.json\n" + PROFILE_HEAD))
    assert codes(loaded) == ["PWR015"] and loaded.ok
    finding = loaded.findings[0]
    assert (finding.line, finding.col, finding.severity) == (1, 10, Severity.WARNING)
    assert "profile.json" in finding.hint
    assert load_document(write(tmp_path, "q.toml",
                               "#:schema ../power/orchestrator/schemas/profile.json\n" + PROFILE_HEAD)).findings == []


def test_wrong_kind_for_the_use(tmp_path):
    loaded = load_manifest(write(tmp_path, "p.toml", PROFILE_HEAD))
    assert codes(loaded) == ["PWR012"] and loaded.kind == "profile" and loaded.model is None
    assert "expected a manifest" in loaded.findings[0].message and loaded.findings[0].line == 1


def test_every_error_of_a_file_at_once(tmp_path):
    body = ('spec_mode = "dflash2"\nspec_draft_max = 99\nspec_mtp_adaptive = true\nfoo = 1\n'
            '[runtime]\nbatch = 0\n[sampling]\ntemperature = -1.0\n')
    loaded = load_profile(write(tmp_path, "p.toml", PROFILE_HEAD + body))
    assert codes(loaded) == ["PWR401", "PWR405", "PWR020", "PWR022", "PWR409"]
    assert [finding.line for finding in loaded.findings] == [4, 5, 6, 8, 10]


def test_locate_and_finding_point_later_checks_at_the_manifest_line(tmp_path):
    text = (
        MANIFEST_HEAD
        + f'[target]\npath = "t.gguf"\nsha256 = "{SHA_A}"\n\n[[drafters]]\nkind = "mtp"\n\n'
        f'[[drafters]]\nkind = "dspark"\npath = "d.gguf"\nsha256 = "{SHA_A}"\ntarget_sha256 = "{SHA_A}"\n'
    )
    loaded = load_manifest(write(tmp_path, "m.toml", text))
    assert loaded.ok
    assert loaded.locate("drafters[1].sha256") == (13, 1, f'sha256 = "{SHA_A}"')
    assert loaded.locate(("target", "path")) == (4, 1, 'path = "t.gguf"')
    finding = loaded.finding("PWR112", "the declared sha256 differs from the file's digest", where="drafters[1].sha256",
                             hint="fix it")
    assert (finding.file, finding.line, finding.col, finding.where) == (str(loaded.path), 13, 10, "drafters[1].sha256")
    assert finding.severity is Severity.ERROR
    assert finding.render().startswith(f"{loaded.path}:13:10: PWR112 [error]")


def test_a_long_bad_value_is_quoted_short(tmp_path):
    loaded = load_profile(write(tmp_path, "p.toml", PROFILE_HEAD + f'spec_draft_max = "{"7" * 5000}"\n'))
    assert len(loaded.findings[0].message) < 160


def test_a_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + PROFILE_HEAD.encode())
    assert load_document(path).ok


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_never_raises_on_any_bytes(tmp_path, content):
    path = tmp_path / "fuzz.toml"
    path.write_bytes(content)
    loaded = load_document(path)
    assert loaded.ok or loaded.findings


def test_path_to_a_file_in_a_missing_directory(tmp_path):
    single(load_document(Path(tmp_path, "no", "such", "dir.toml")), "PWR001")


# Known keys of every kind and nested table, plus a few unknown ones, with values of any type.
KNOWN_KEYS = sorted({name for model in KIND_MODELS.values() for name in model.model_fields} | {
    "path", "sha256", "size", "kind", "target_sha256", "ctx", "verify_capacity", "gpu_layers", "temperature",
    "vram", "model", "devices", "host", "traffic", "nope"} - {"schema_id"})
ANY_VALUE = st.recursive(
    st.one_of(st.integers(-2, 70), st.booleans(), st.sampled_from(["mtp", "dflash2", "24 GiB", "x", "all", SHA_A, ""])),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.sampled_from(KNOWN_KEYS), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(list(KIND_MODELS)), st.dictionaries(st.sampled_from(KNOWN_KEYS), ANY_VALUE, max_size=6))
def test_any_values_under_known_keys_give_located_findings_never_a_crash(tmp_path, kind, data):
    lines = [f'schema = "power.{kind}/v1"'] + [f"{toml_key(key)} = {toml_value(value)}" for key, value in data.items()]
    loaded = load_document(write(tmp_path, "fuzz.toml", "\n".join(lines) + "\n"))
    assert loaded.kind == kind
    assert loaded.ok or loaded.findings
    for finding in loaded.findings:
        assert finding.line is not None and finding.col is not None and finding.file == str(loaded.path)
        assert finding.code.startswith(("PWR0", "PWR4")) and finding.hint
