"""PWR31x: a drafter's tokenizer against the target's, over the complete vocabulary.

Speculation compares token ids, so both files must map every id to the same
string. The comparison (tokens, types, merges, model, pre-tokenizer, special
ids) is `power.artifacts.tokenizer_facts.compare_tokenizers`; any difference
fails closed (llama.cpp tolerates a 128-token size difference: we do not).
"""

from __future__ import annotations

from power.artifacts.tokenizer_facts import compare_tokenizers
from power.findings import Finding, Severity
from power.orchestrator.planning.checks.artifacts import Checked


def check_tokenizer(index: int, kind: str, drafter: Checked, target: Checked) -> list[Finding]:
    ours, theirs = drafter.facts.tokenizer, target.facts.tokenizer
    if ours is None or theirs is None:
        missing = drafter.facts.path if ours is None else target.facts.path
        return [Finding("PWR311", Severity.INFO, f"drafters[{index}] ({kind}): {missing} carries no tokenizer; "
                        "the drafter uses the target's token ids as they are", file=drafter.facts.path)]
    differences = compare_tokenizers(theirs, ours)
    if not differences:
        return []
    return [
        Finding(
            "PWR310",
            Severity.ERROR,
            f"drafters[{index}] ({kind}): its tokenizer differs from the target's: "
            + "; ".join(differences[:4])
            + (f" (and {len(differences) - 4} more)" if len(differences) > 4 else ""),
            file=drafter.facts.path,
            hint=f"use a drafter built for the target's tokenizer (target {theirs.short_fingerprint}, "
            f"drafter {ours.short_fingerprint})",
        )
    ]
