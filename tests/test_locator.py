from hypothesis import given, settings
from hypothesis import strategies as st

from power.orchestrator.locator import TomlLocator, format_where, parse_where

FLEET = '''#:schema ../orchestrator/schemas/fleet.json
schema = "power.fleet/v1"
name = 'lab'  # a comment with = and [brackets]

[[hosts]]
name = "a"
devices = [{ model = "RTX 4090", vram = "24 GiB" },
   { model = "RTX 3090", vram = 1 }]
labels.zone = "lab"

[[hosts]]
name = "b"
notes = """multi
line = 3
[not.a.table]
"""
devices = [ { model = "H200", vram = "141 GB" } ]

[hosts.labels]
"a.b" = "quoted"

[[deployments]]
host = "a"
'''


def at(locator, where, kind="key"):
    position = getattr(locator, kind)(parse_where(where))
    return (position.line, position.col) if position else None


def test_tables_arrays_of_tables_inline_tables_and_dotted_keys():
    locator = TomlLocator(FLEET)
    assert at(locator, "schema") == (2, 1)
    assert at(locator, "schema", "value") == (2, 10)
    assert at(locator, "hosts[0]") == (5, 1)
    assert at(locator, "hosts[1]") == (11, 1)
    assert at(locator, "hosts[0].devices[1].vram") == (8, 26)
    assert at(locator, "hosts[0].devices[1].vram", "value") == (8, 33)
    assert at(locator, "hosts[0].devices[0]", "value") == (7, 12)
    assert at(locator, "hosts[0].labels.zone") == (9, 8)
    assert at(locator, "hosts[1].devices[0].model") == (17, 15)
    assert at(locator, 'hosts[1].labels."a.b"') == (20, 1)
    assert at(locator, "deployments[0].host") == (23, 1)


def test_text_inside_strings_is_not_mistaken_for_keys_or_tables():
    locator = TomlLocator(FLEET)
    assert at(locator, "hosts[1].line") == (11, 1)  # falls back to the [[hosts]] header
    assert at(locator, "not.a.table") is None


def test_unknown_paths_fall_back_to_the_nearest_ancestor_and_source_line_is_kept():
    locator = TomlLocator(FLEET)
    position = locator.key(parse_where("hosts[0].devices[1].nope"))
    assert (position.line, position.col) == (8, 4)
    assert position.source_line == "   { model = \"RTX 3090\", vram = 1 }]"


def test_where_round_trips():
    for where in ["drafters[1].sha256", "runtime.ctx", 'labels."a.b"', "hosts[0].devices[2].vram"]:
        assert format_where(parse_where(where)) == where
    assert parse_where("drafters[1].sha256") == ("drafters", 1, "sha256")


def test_deep_nesting_is_skipped_not_followed():
    text = "a = " + "[" * 5000 + "]" * 5000 + "\nb = 2\n"
    assert at(TomlLocator(text), "b") == (2, 1)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list('[]{}"\'=.,#\n \\abc123') + ['"""', "'''", "[[", "]]", "a = "]), max_size=80).map("".join))
def test_never_raises_on_any_text(text):
    locator = TomlLocator(text)
    for where in ["a", "a.b", "a[0]", "a[0].b", "abc.a[1]"]:
        locator.key(parse_where(where))
        locator.value(parse_where(where))
