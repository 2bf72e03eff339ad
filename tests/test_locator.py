import tomli
from hypothesis import given, settings
from hypothesis import strategies as st
from toml_helpers import toml_key, toml_value

from power.orchestrator.inputs.locator import TomlLocator, format_where, parse_where

FLEET = '''#:schema ../power/orchestrator/schemas/fleet.json
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
@given(st.lists(st.sampled_from(list('[]{}"\'=.,#\n \\abc123') + ['"""', "'''", "[[", "]]", "a = "]),
                max_size=80).map("".join))
def test_never_raises_on_any_text(text):
    locator = TomlLocator(text)
    for where in ["a", "a.b", "a[0]", "a[0].b", "abc.a[1]"]:
        locator.key(parse_where(where))
        locator.value(parse_where(where))


# --- property: every key of a generated document is located exactly -------------------------

KEYS = st.one_of(st.from_regex(r"[a-z][a-z0-9_-]{0,6}", fullmatch=True), st.sampled_from(["a.b", "x y", "é", "q\"t"]))
SCALARS = st.one_of(st.integers(-10**6, 10**6), st.booleans(), st.text(alphabet='ab ="#[]{},.\\\n\'', max_size=8))
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=8,
)
TABLES = st.dictionaries(KEYS, VALUES, max_size=3)
DOCUMENTS = st.fixed_dictionaries(
    {"scalars": st.dictionaries(KEYS, VALUES, max_size=3), "tables": st.dictionaries(KEYS, TABLES, max_size=2),
     "arrays": st.dictionaries(KEYS, st.lists(TABLES, min_size=1, max_size=2), max_size=2)}
)


def render(document) -> tuple[str, dict]:
    lines, data = [], {}
    for key, value in document["scalars"].items():
        lines.append(f"{toml_key(key)} = {toml_value(value)}")
        data[key] = value
    for name, table in document["tables"].items():
        if name in data:
            continue
        lines.append(f"[{toml_key(name)}]")
        lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in table.items()]
        data[name] = table
    for name, tables in document["arrays"].items():
        if name in data:
            continue
        for table in tables:
            lines.append(f"[[{toml_key(name)}]]")
            lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in table.items()]
        data[name] = tables
    return "\n".join(lines) + "\n", data


def paths(value, prefix=()):
    if isinstance(value, dict):
        for key, item in value.items():
            yield prefix + (key,)
            yield from paths(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from paths(item, prefix + (index,))


@settings(max_examples=150, deadline=None)
@given(DOCUMENTS)
def test_every_key_of_a_generated_document_is_located_exactly(document):
    text, data = render(document)
    assert tomli.loads(text) == data
    locator = TomlLocator(text)
    for path in paths(data):
        position = locator.key(path)
        assert position is not None, path
        written = position.source_line[position.col - 1 :]
        key = path[-1] if isinstance(path[-1], str) else None
        if key is not None:
            assert written.startswith((toml_key(key), f"[{toml_key(key)}]", f"[[{toml_key(key)}]]")), (path, text)


def span(locator, where, kind="key"):
    position = getattr(locator, kind)(parse_where(where))
    return position.line, position.col, position.end_col


def test_keys_and_values_end_where_their_text_ends_on_the_line():
    locator = TomlLocator(FLEET)
    assert span(locator, "schema", "value") == (2, 10, 26)  # "power.fleet/v1" with its quotes
    assert span(locator, "name", "value") == (3, 8, 13)  # 'lab', not the comment after it
    assert span(locator, "hosts[0]") == (5, 1, 10)  # the whole [[hosts]] header
    assert span(locator, "hosts[0].devices[1].vram", "value") == (8, 33, 34)  # a number ends before its "}"
    assert span(locator, "hosts[0].devices[0]", "value") == (7, 12, 51)  # an inline table, braces included
    assert span(locator, "hosts[0].devices", "value") == (7, 11, 52)  # an array going on: to its line's end
    assert span(locator, "hosts[0].labels.zone") == (9, 8, 12)  # one segment of a dotted key
    assert span(locator, "hosts[1].notes", "value") == (13, 9, 17)  # a multi-line string: its first line
    assert span(locator, 'hosts[1].labels."a.b"') == (20, 1, 6)  # a quoted key, quotes included
