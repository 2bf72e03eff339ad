"""The committed llama-server option table is the real binary's: spellings, values, env names, defaults, removals."""

from __future__ import annotations

import os
import subprocess

import pytest
from llama_server import binary

from power.orchestrator.engines.llama_server import flags as llama_flags

pytestmark = pytest.mark.llama_server  # outside `scripts/test --fast`: runs the real llama-server binary


def _run(*argv: str, env: dict | None = None) -> str:
    run = subprocess.run([str(binary()), *argv], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **(env or {})})
    return run.stdout + run.stderr


def test_the_table_is_what_the_binary_lists():
    listed = llama_flags.parse_help(_run("--help"))
    committed = llama_flags.table().options
    assert [(o.spellings, o.value, o.env, o.default, o.removed is not None) for o in listed] == \
        [(o.spellings, o.value, o.env, o.default, o.removed is not None) for o in committed]
    assert llama_flags.table().llama_cpp in _run("--version")


@pytest.mark.parametrize("option", [o for o in llama_flags.table().options if o.removed], ids=lambda o: o.name)
def test_each_removed_option_stops_the_binary_with_the_recorded_reason(option):
    words = ["1"] * option.values
    assert llama_flags.ARGUMENT_ERROR.format(flag=option.name, reason=option.removed) in _run(option.name, *words)
    if option.env:
        assert llama_flags.ENV_ERROR.format(env=option.env, reason=option.removed) in _run(env={option.env: "1"})


def test_an_unknown_word_and_a_missing_value_are_worded_as_the_binary_words_them():
    assert llama_flags.INVALID_ARGUMENT.format(flag="--no-such-flag") in _run("--no-such-flag")
    assert llama_flags.ARGUMENT_ERROR.format(flag="-c", reason=llama_flags.MISSING_VALUE) in _run("-c")
