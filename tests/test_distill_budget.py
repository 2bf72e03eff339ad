"""`power drafter distill --budget` holds by construction (issue 40): training stops before the step that would not
fit beside the phases after it, the served replay stops before the sequence that would not fit, a budget that cannot
hold the phases after training is refused before anything is trained, and distill.json records each phase's seconds.

The decisions are driven by a clock the test moves (a slowed objective: each training sequence and each held-back
evaluation takes a known number of its seconds), so no assert depends on how fast this host runs."""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch
from click.testing import CliRunner
from gguf_helpers import fixtures
from plan_helpers import write_manifest
from spec_helpers import copying_mtp_sidecar, plain_stream, prompt_for

from power.app.cli import main
from power.drafters.budget import Budget
from power.drafters.distill import DistillRequest, recipe
from power.drafters.generate import NO_LABEL, Example, corpus_examples
from power.drafters.served import Served, replay
from power.drafters.train import Objective, Trainer, TrainSettings
from power.modes import DFLASH, MTP
from power.runtime.gguf_weights import GGUFFile
from power.runtime.tokenizer import Tokenizer
from power.runtime.trunks import load_trunk

TALE = "Once upon a time a fox ran across the quiet field and into the wood, where an owl sat and watched. "


class Clock:
    """A clock that moves only when the work the test slowed runs."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Slowed:
    """An objective whose every training sequence costs `sequence_s` and every held-back sequence `held_s` of the
    clock: a host as slow as the test says."""

    inner: Objective
    clock: Clock
    sequence_s: float
    held_s: float

    @property
    def net(self):
        return self.inner.net

    @property
    def positions(self) -> int:
        return self.inner.positions

    def loss(self, example: Example, generator: torch.Generator) -> torch.Tensor:
        self.clock.now += self.sequence_s
        return self.inner.loss(example, generator)

    def accepted(self, example: Example) -> torch.Tensor:
        self.clock.now += self.held_s
        return self.inner.accepted(example)


def _dense_dflash(tmp_path, clock: Clock, sequence_s: float, held_s: float) -> tuple[Slowed, list[Example]]:
    target = GGUFFile(fixtures()["dense-target"])
    how = recipe(DistillRequest(target.path, DFLASH, tmp_path), target)
    trunk = load_trunk(target, n_ctx=64, verify_capacity=1)
    examples = corpus_examples(trunk, Tokenizer.from_gguf(target), [TALE * 4], how.taps, window=16, progress=False)
    objective = how.objective(target, None, max(len(e.tokens) for e in examples), seed=0)
    return Slowed(objective, clock, sequence_s, held_s), examples


def test_training_stops_before_the_step_that_would_not_fit_beside_what_follows_it(tmp_path):
    """Steps of 16 s (four sequences of 4 s), evaluations of 1 s (two held-back sequences of 0.5 s), 30 s and two
    evaluations reserved for the phases after training, in 199 s: each step is charged before it starts at its
    measured cost, so training ends with room for its last evaluation and the reserve."""
    clock = Clock()
    objective, examples = _dense_dflash(tmp_path, clock, sequence_s=4.0, held_s=0.5)
    trainer = Trainer(objective, TrainSettings(eval_every=5), examples[2:], examples[:2], k=3)
    budget = Budget(199.0, clock)
    trainer.measure_costs(None, clock)
    assert trainer.eval_s == 1.0 and trainer.closing_s == 1.0 and clock.now == 1.0 + 4.0  # and one sequence's pass

    def reserve(evaluation_s: float) -> float:
        return 30.0 + 2 * evaluation_s

    trainer.run(budget, None, progress=False, reserve=reserve)
    # 5 s measuring, then steps of 16 s with an evaluation after the fifth: 9 steps end at 5 + 144 + 1 = 150 s. A
    # tenth (16 s and the evaluation it ends on, then the closing evaluation and 32 s reserved) would end at 200 s.
    assert trainer.step == 9
    assert clock.now == 150.0 + 1.0  # the closing evaluation, which the loop kept room for
    assert budget.fits(reserve(trainer.eval_s))


def test_a_slower_step_is_charged_at_once(tmp_path):
    """The next step is charged as the slowest of the recent ones: a host that slows mid-run stops training a step
    earlier rather than a step late."""
    clock = Clock()
    objective, examples = _dense_dflash(tmp_path, clock, sequence_s=1.0, held_s=0.5)
    trainer = Trainer(objective, TrainSettings(eval_every=1000), examples[2:], examples[:2], k=3)
    trainer.measure_costs(None, clock)
    assert trainer.next_step_s([]) == 4.0  # before any step: four sequences at the measured sequence's cost
    assert trainer.next_step_s([4.0, 16.0, 4.0]) == 16.0


def _gemma_sequences(count: int) -> list[Example]:
    prompt = prompt_for("gemma3")
    generated = list(plain_stream("gemma3", 24))
    text = prompt + generated
    return [Example(torch.tensor(text[:-1]), torch.tensor([NO_LABEL] * (len(prompt) - 1) + generated),
                    torch.zeros(len(text) - 1, 1, dtype=torch.bfloat16))] * count


def test_the_served_replay_stops_before_the_sequence_that_would_not_fit():
    """The first sequence always runs (its cost was reserved ahead); each later one starts only when its cost at the
    rate measured beforehand (seconds per token and width) fits beside what follows the replay, and the replay says
    how many of the sequences it was given it reached."""
    sequences = _gemma_sequences(3)
    tokens = len(sequences[0].tokens)
    measured = Served(pass_s=1.0)  # one second per token and width: a sequence at two widths costs 2 x its tokens
    clock = Clock()
    roomy = replay(fixtures()["gemma3-target"], copying_mtp_sidecar(), MTP, sequences, [2, 3],
                   Budget(3 * 2 * tokens + 5.0, clock), measured=measured, reserve_s=5.0)
    tight = replay(fixtures()["gemma3-target"], copying_mtp_sidecar(), MTP, sequences, [2, 3],
                   Budget(2 * tokens + 5.0 - 1.0, clock), measured=measured, reserve_s=5.0)
    assert (roomy.sequences, roomy.offered) == (3, 3)
    assert (tight.sequences, tight.offered) == (1, 3)
    assert tight.document({"2": 1.0, "3": 1.0})["sequences"] == 1


def test_distill_ends_within_its_budget_and_refuses_one_that_cannot_hold_the_export(tmp_path):
    """End to end on the dense fixture: distill.json records the budget and every phase, training ran and the replay
    reached at least its first sequence (whether the wall time held is this host's speed, not the code's: the clock
    tests above prove each decision); a rerun whose budget cannot hold the phases after training (the rows
    reused from the first run) is refused with PWR027 before anything is trained or written."""
    manifest = write_manifest(tmp_path, "dense-target", [], name="fixture")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"Line {i} of the tale" for i in range(24)) + "\n")
    out = tmp_path / "out"
    args = ["drafter", "distill", str(manifest), "--kind", DFLASH, "--prompts", str(prompts), "--max-new-tokens", "8",
            "--slots", "2", "--quiet", "-o", str(out)]
    distilled = CliRunner().invoke(main, [*args, "--budget", "30s"])
    assert distilled.exit_code == 0, distilled.output
    report = json.loads((out / "distill.json").read_text())
    budget = report["budget"]
    assert budget["budget_s"] == 30.0
    assert sum(budget["phases_s"].values()) <= budget["spent_s"] + 1e-3
    assert {"start", "data", "measure", "train", "written curve", "export", "replay"} <= set(budget["phases_s"])
    assert report["steps"] >= 1 and 1 <= report["served"]["sequences"] <= report["served"]["offered"]
    assert f"over {report['served']['sequences']} of {report['served']['offered']} held-back" in distilled.output
    drafter = next(out.glob("*.gguf"))
    drafter.unlink()
    refused = CliRunner().invoke(main, [*args, "--budget", "0.01s"])
    assert refused.exit_code == 2 and "PWR027" in refused.output and "--budget" in refused.output, refused.output
    assert not drafter.exists() and (out / "resume" / "data.pt").exists()
