"""A drafter that cannot win, of every kind and chain, on the bundled Gemma: the plan emits the target's own greedy
stream, and the cost governor holds the drafter to the request's loss budget (issue 41; the rates are measured by
bench/bench_parked.py, never asserted here)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest
from spec_helpers import GEMMA, Calls, gguf, trunk

from power.drafters.export import CHAINED_NGRAM_DRAFT_MIN, CHAINED_NGRAM_MATCH
from power.drafters.prompt_sets import load_prompts
from power.drafters.untrained import write_untrained
from power.runtime.decoder import Decoder
from power.runtime.gguf_weights import GGUFFile
from power.runtime.governor import GovernorConfig
from power.runtime.sampling import Sampler, SamplingParams
from power.runtime.scheduler import SchedulerConfig
from power.runtime.speculators import registry
from power.runtime.speculators.base import NGramWindow, SpeculatorRequest
from power.runtime.speculators.chain import ChainSpeculator
from power.runtime.tokenizer import Tokenizer

pytestmark = pytest.mark.slow  # the real Gemma for 64 tokens a plan, and three drafter files written

TOKENS = 64
K = 6


@lru_cache(maxsize=None)
def untrained(kind: str, directory: Path) -> GGUFFile:
    return GGUFFile(write_untrained(kind, GEMMA, directory / f"{kind}.gguf"))


def _speculator(plan: str, directory: Path):
    def member(kind: str):
        drafter = None if kind == "ngram" else untrained(kind, directory)
        return registry.create(kind, SpeculatorRequest(trunk("gemma"), target=gguf("gemma"), drafter=drafter,
                                                       ngram=NGramWindow(CHAINED_NGRAM_MATCH, CHAINED_NGRAM_DRAFT_MIN,
                                                                         K)))
    kinds = plan.split(" -> ")
    return member(kinds[0]) if len(kinds) == 1 else ChainSpeculator([member(kind) for kind in kinds])


@pytest.fixture(scope="module")
def drafters(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("untrained")


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    tokenizer = Tokenizer.from_gguf(gguf("gemma"))
    held_out = load_prompts(which="heldout")
    return [tokenizer.encode(next(p.text for p in held_out if p.shape == shape)) for shape in ("prose", "code")]


@pytest.fixture(scope="module")
def target_only(prompts) -> list[list[int]]:
    decoder = Decoder(trunk("gemma"), Sampler(SamplingParams()))
    return [decoder.generate(prompt, TOKENS).tokens for prompt in prompts]


@pytest.mark.parametrize("plan", ["mtp", "dflash", "dspark", "ngram -> mtp"])
def test_an_untrained_drafter_emits_the_target_only_stream_and_is_held_to_the_budget(plan, drafters, prompts,
                                                                                      target_only):
    decoder = Decoder(trunk("gemma"), Sampler(SamplingParams()), _speculator(plan, drafters),
                      SchedulerConfig(k=K, s=K), GovernorConfig())
    for prompt, expected in zip(prompts, target_only, strict=True):
        generation = decoder.generate(prompt, TOKENS)
        assert generation.tokens == expected
        stats = generation.stats
        if " -> " not in plan:  # (a lookup in front may land its drafts and earn its rounds)
            assert stats.speculative_rounds <= stats.rounds // 4  # the governor's budget, not the drafter, decides
            assert stats.proposed <= stats.speculative_rounds or stats.accepted  # one token a round until one lands
    governor = decoder.slots[0].governor
    assert governor is not None and governor.members[-1].measured
    assert governor.members[-1].row_cost > 0  # the drafter timed its catch-up, and the governor charges it a row


class Forwards:
    """The trunk as the decoder drives it, writing each decode forward's rows in `log`: (position, tokens) a part."""

    def __init__(self, target, log: list) -> None:
        self.target, self.log = target, log

    def __getattr__(self, name: str):
        return getattr(self.target, name)

    def forward_parts(self, parts, taps=()):
        self.log.append(tuple((self.target.sequence(p.slot).position, tuple(p.tokens)) for p in parts))
        return self.target.forward_parts(parts, taps)


@pytest.mark.parametrize("plan", ["mtp", "dflash"])
def test_a_plain_round_inside_a_plan_is_a_target_only_round(plan, drafters, prompts):
    """Every round the governed drafter does not propose in makes the target-only round's one forward (the same row at
    the same position) and calls the drafter not at all; it is told what it missed on the round it next proposes in."""
    alone: list = []
    Decoder(Forwards(trunk("gemma"), alone), Sampler(SamplingParams())).generate(prompts[0], TOKENS)
    log: list = []
    decoder = Decoder(Forwards(trunk("gemma"), log), Sampler(SamplingParams()), Calls(_speculator(plan, drafters), log),
                      SchedulerConfig(k=K, s=K), GovernorConfig())
    decoder.generate(prompts[0], TOKENS)
    rounds: list[list] = [[]]
    for event in log:
        rounds[-1].append(event)
        if isinstance(event, tuple) and isinstance(event[0], tuple):  # a forward ends the round's calls
            rounds.append([])
    plain = [r for r in rounds[:-1] if "propose" not in r]
    assert len(plain) > len(rounds) // 2 and all(len(r) == 1 for r in plain)  # the forward, nothing else
    assert {r[0] for r in plain} <= set(alone)
    assert all(r[0] == "checkpoint" and r[-2] == "propose" for r in rounds[:-1] if "propose" in r)
