"""The seeds' worth-it arithmetic: the worked example, break-even, and the command's report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from power.orchestrator.cli import main
from power.orchestrator.worth_it import assess, break_even_p, expected_accepted, rate, round_time


def test_expected_accepted_is_the_geometric_sum():
    assert expected_accepted(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_accepted(1.0, 3) == 4.0
    assert expected_accepted(0.0, 7) == 1.0


def test_worked_example_is_a_loss():
    # t_s = 67 ms, d_s = 12 ms, incumbent 25 tok/s, K = 3, realistic p 0.4-0.6.
    report = assess(target_step=0.067, draft_step=0.012, k=3, incumbent_rate=25.0, incumbent_commit=1.67)
    assert round_time(3, 0.012, 0.067) == pytest.approx(0.1097)
    rates = dict(report.band_rates)
    # The seeds' "17-20 tok/s": the band's midpoint and top.
    assert rates[0.5] == pytest.approx(17.1, abs=0.1)
    assert rates[0.6] == pytest.approx(19.8, abs=0.1)
    assert max(rates.values()) < 25.0
    assert report.verdict == "loss" and report.target_already_drafts


def test_break_even_against_the_incumbent():
    # The seeds round this to ~0.70; with the 1.1 verification factor it is 0.75 (docs/worth-it.md).
    p3 = break_even_p(3, 0.012, 0.067, 25.0)
    assert 0.70 <= p3 <= 0.76
    assert rate(p3, 3, 0.012, 0.067) == pytest.approx(25.0, rel=1e-6)
    # K = 1 cannot reach 25 tok/s even when every proposal is accepted.
    assert break_even_p(1, 0.012, 0.067, 25.0) is None
    # A slow target makes the same drafter pay off.
    assert assess(target_step=0.4, draft_step=0.012, k=3, incumbent_rate=2.5).verdict == "win"


def test_command_reports_in_the_seeds_order():
    result = CliRunner().invoke(main, ["worth-it", "--target-step", "67ms", "--draft-step", "12ms", "-k", "3",
                                       "--incumbent", "25", "--incumbent-commit", "1.67"])
    assert result.exit_code == 0, result.output
    steps = [line[:2] for line in result.output.splitlines() if line[:1].isdigit()]
    assert steps == ["1.", "2.", "3.", "4.", "5."]
    assert "LOSS" in result.output and "K=7" in result.output


def test_command_json_and_derived_target_step():
    result = CliRunner().invoke(main, ["worth-it", "--draft-step", "12ms", "-k", "3", "--incumbent", "25",
                                       "--incumbent-commit", "1.67", "--p-band", "0.4:0.6", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["target_step_s"] == pytest.approx(1.67 / 25)
    assert set(data["break_even"]) == {"1", "3", "7"}


@pytest.mark.parametrize("args", [["--draft-step", "12"], ["--draft-step", "12ms", "--p-band", "0.7:0.2"]])
def test_bad_input_is_a_usage_error(args):
    result = CliRunner().invoke(main, ["worth-it", "-k", "3", "--incumbent", "25", *args])
    assert result.exit_code == 2
    assert "e.g." in result.output or "LOW <= HIGH" in result.output


def test_a_plan_answers_fit_and_attachment(tmp_path):
    golden = Path(__file__).parent / "golden" / "render" / "dspark-ngram.plan.json"
    result = CliRunner().invoke(main, ["worth-it", "--target-step", "67ms", "--draft-step", "12ms", "-k", "3",
                                       "--incumbent", "25", "--plan", str(golden)])
    assert result.exit_code == 0, result.output
    (fit,) = [line for line in result.output.splitlines() if line.startswith("4.")]
    assert "plan qwen3.6-27b-q6k-dspark: fits" in fit and "attaches as ngram -> dspark" in fit
    edited = tmp_path / "edited.json"
    edited.write_text(golden.read_text().replace('"k": 10', '"k": 9'))
    refused = CliRunner().invoke(main, ["worth-it", "--draft-step", "12ms", "-k", "3", "--incumbent", "25",
                                        "--plan", str(edited)])
    assert refused.exit_code == 2 and "digest mismatch" in refused.output
