"""The A/B protocol's traffic shapes: deterministic, and built the way the protocol says each must be."""

from __future__ import annotations

import re

import pytest

from power.app.bench.traffic import (
    HELDOUT_LABELS,
    HELDOUT_PROMPTS,
    SHAPE_NAMES,
    SPAN_LIMIT,
    build_shape,
    longest_repeated_span,
    parse_shapes,
    unique_lines,
)


def test_shapes_are_the_same_text_on_every_call() -> None:
    for name in SHAPE_NAMES:
        assert build_shape(name, 96) == build_shape(name, 96)


def test_echo_passage_has_unique_lines_and_no_repeated_span_longer_than_three_words() -> None:
    passage = build_shape("echo", 256).prompt.split("Passage:\n")[1].split("\n\n")[0]
    lines = passage.splitlines()
    assert len(lines) >= 20 and len(set(lines)) == len(lines)
    assert longest_repeated_span(passage.split()) <= SPAN_LIMIT


def test_the_passage_grows_with_the_token_budget() -> None:
    assert len(build_shape("echo", 512).prompt) > 3 * len(build_shape("echo", 128).prompt)


@pytest.mark.parametrize("count, seed", [(10, 0), (60, 7), (150, 2)])
def test_unique_lines_never_repeat_a_run_longer_than_the_limit(count: int, seed: int) -> None:
    lines = unique_lines(count, seed)
    assert len(lines) == count and longest_repeated_span(" ".join(lines).split()) <= SPAN_LIMIT


def test_longest_repeated_span_finds_the_longest_run() -> None:
    assert longest_repeated_span("a b c d".split()) == 0
    assert longest_repeated_span("x a b c y a b c z".split()) == 3
    assert longest_repeated_span("a a a".split()) == 2  # overlapping occurrences count


def test_structured_asks_for_unique_ids_and_gives_no_passage_to_copy() -> None:
    shape = build_shape("structured", 64)
    assert "unique" in shape.prompt and "counting up" in shape.prompt
    assert not re.search(r"\b1000\d\d\b.*\|", shape.prompt)  # no sample record line for the matcher to copy


def test_prose_asks_for_one_sentence_and_identity_is_short_and_greedy() -> None:
    assert "one sentence" in build_shape("prose", 64).prompt
    identity = build_shape("identity", 512)
    assert identity.temperature == 0.0 and identity.max_tokens == 16
    assert all(build_shape(name, 64).temperature == 0.0 for name in SHAPE_NAMES)


def test_parse_shapes_keeps_order_drops_duplicates_and_names_unknown_shapes() -> None:
    assert parse_shapes("echo, prose,echo") == ["echo", "prose"]
    with pytest.raises(ValueError, match="poetry"):
        parse_shapes("echo,poetry")
    with pytest.raises(ValueError, match="none given"):
        parse_shapes(" , ")
    with pytest.raises(ValueError, match="unknown traffic shape"):
        build_shape("poetry")


def test_the_reference_sizes_in_gemma_tokens() -> None:
    """echo: a ~1.5k-token passage; prose: ~1k tokens of filler (the reference A/B protocol)."""
    from pathlib import Path

    from power.app.bench.traffic import REFERENCE_PROMPT_TOKENS
    from power.runtime.gguf_weights import GGUFFile
    from power.runtime.tokenizer import Tokenizer

    gemma = Path(__file__).resolve().parents[1] / "models" / "gemma-3-270m-q4_k_m.gguf"
    tokenizer = Tokenizer.from_gguf(GGUFFile(gemma))
    echo = len(tokenizer.encode(build_shape("echo", 64, REFERENCE_PROMPT_TOKENS).prompt))
    prose = len(tokenizer.encode(build_shape("prose", 64, REFERENCE_PROMPT_TOKENS).prompt))
    assert 1400 <= echo <= 1750 and 900 <= prose <= 1200, (echo, prose)
    # sized by the answer alone when no prompt size is asked for, as before
    assert build_shape("echo", 64) == build_shape("echo", 64, None)


@pytest.mark.parametrize("name", sorted(HELDOUT_LABELS))
def test_natural_shapes_cycle_through_held_out_prompts_no_training_prompt_shares(name: str) -> None:
    from power.drafters.prompt_sets import load_prompts

    shape = build_shape(name, 64)
    # every shape sends eight prompts but the non-repeating prose, which has the few its selection kept
    assert len(shape.prompts) == len(set(shape.prompts)) == (HELDOUT_PROMPTS if name != "nonrepeating" else
                                                             len(load_prompts(which="nonrepeating")))
    assert [shape.prompt_for(run) for run in (0, 1, len(shape.prompts))] == [shape.prompts[0], shape.prompts[1],
                                                                               shape.prompts[0]]
    assert not set(shape.prompts) & {p.text for p in load_prompts(which="train")}
    assert build_shape(name, 64, 1536) == shape  # fixed requests: the passage size does not apply
