"""`power schema KIND`: print the JSON Schema of a file kind (editors read it through a `#:schema` line)."""

from __future__ import annotations

import click

from power.orchestrator.inputs.schema import KIND_MODELS, json_schema_text


@click.command()
@click.argument("kind", type=click.Choice(list(KIND_MODELS)))
def schema(kind: str) -> None:
    """Print the JSON Schema of KIND (manifest, profile, host or fleet).

    The committed copies live in power/orchestrator/schemas/; refresh one with
    `power schema KIND > power/orchestrator/schemas/KIND.json`.
    """
    click.echo(json_schema_text(kind), nl=False)
