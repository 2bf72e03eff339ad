"""`power bench --write-env`: the winner (else the incumbent) rendered as the deployment's env file, with the measured
table as its comment, in the env file its engine reads (the adapter's `env_target`)."""

from __future__ import annotations

from typing import Any, Sequence

from power.orchestrator.engines import adapter


def env_file_text(engine: str, best: dict[str, Any] | None, configs: Sequence[Any], control: Any, table: str) -> str:
    """The env file of the configuration whose plan won (`best`'s candidate), else of the incumbent (`control`, or
    the only configuration), its first lines saying which and why, then the table."""
    from power.orchestrator.launch.render import render

    chosen = next((c for c in configs if best and c.plan.digest == best["candidate"]["plan_digest"]), None)
    if chosen is None:
        chosen = control or configs[0]
        verdict = ("no candidate won on every measured shape: this is the incumbent's env; do not switch without "
                   "re-measuring")
    else:
        verdict = f"the winner: {chosen.label} (plan {chosen.plan.digest[:12]}), measured against the incumbent below"
    body = render(chosen.plan, str(adapter(engine).env_target), chosen.plan_path)
    measured = "\n".join(f"# {line}".rstrip() for line in [f"power bench on {engine}: {verdict}", "",
                                                             *table.splitlines()])
    return measured + "\n" + body
