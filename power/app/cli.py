"""The `power` command line: a click group whose sub-commands load lazily.

Each sub-command lives in its own module under `power.app.commands`, so
`power --help` and `power validate` never import torch. Exit codes, for every command:
0 ok, 1 check failures (error findings), 2 usage or input error.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import NoReturn

import click
from typing_extensions import override

from power import __version__
from power.findings import Finding, PowerError

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2


def refuse(error: PowerError, as_json: bool = False, exit_code: int = EXIT_USAGE, at: Path | None = None) -> NoReturn:
    """End the command on a refusal: its finding on stderr as text (and on stdout as JSON with --json). `at`: the
    file the command was given (a plan), where a finding that names no file of its own is located."""
    finding = error.finding
    if at is not None and finding.file is None:
        finding = dataclasses.replace(finding, file=str(at))
    print_findings([finding], as_json)
    sys.exit(exit_code)


def print_findings(findings: list[Finding], as_json: bool) -> None:
    """Findings as every command reports them: text to stderr; with --json also `{"findings": [...]}` to stdout."""
    if as_json:
        click.echo(json.dumps({"findings": [f.to_json() for f in findings]}, indent=2))
    for finding in findings:
        click.echo(finding.render(), err=True)

# command name -> (module under power.app.commands, attribute, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "validate": ("validate", "validate", "Validate manifests, profiles, hosts and fleets; report every finding."),
    "schema": ("schema", "schema", "Print the JSON Schema of a file kind."),
    "inspect": ("inspect", "inspect", "Inspect a GGUF artifact: header, tensors, tokenizer, drafter contract."),
    "fixtures": ("fixtures", "fixtures", "Build the small test GGUF artifacts (targets and drafters)."),
    "plan": ("plan", "plan", "Compile manifest + profile + host into a resolved engine plan."),
    "size": ("size", "size", "Dry-run VRAM sizing: per-component breakdown and the largest context that fits."),
    "worth-it": ("worth_it", "worth_it", "Break-even arithmetic for a drafter against the incumbent."),
    "pull": ("pull", "pull", "Fetch a manifest's artifacts from where they are published, checked by "
                             "sha256 before placing."),
    "verify": ("verify", "verify",
               "Verify a plan before it runs: its seal, every artifact by full sha256, tokenizers."),
    "render": ("render", "render", "Render launch artifacts (llama-server, vLLM, Power, env, systemd) from a plan."),
    "run": ("run", "run", "Generate with the Power runtime on a plan and print the receipt."),
    "serve": ("serve", "serve", "Serve a plan over OpenAI-style HTTP with /health and /metrics."),
    "bench": ("bench", "bench", "A/B evidence: paired runs of plans over fixed traffic shapes."),
    "fleet": ("fleet", "fleet", "Review a fleet: plan every deployment, show drift against the lock."),
    "rollout": ("rollout", "rollout", "Stage a profile across a fleet, gated by evidence receipts."),
    "drafter": ("drafter", "drafter", "Build drafters: `power drafter distill` trains one for a manifest's target."),
    "kernels": ("kernels", "kernels", "Build the CPU kernels ahead of time (`build`), or show the "
                                      "kernel cache (`status`)."),
    "import": ("import_", "import_", "Turn an existing llama-server or vLLM launch line into manifest + "
                                     "profile and check it."),
}


class LazyGroup(click.Group):
    """A group that imports a sub-command's module only when that command runs."""

    @override
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in COMMANDS if self._module_exists(name)]

    @override
    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS or not self._module_exists(cmd_name):
            return None
        module_name, attribute, _ = COMMANDS[cmd_name]
        module = importlib.import_module(f"power.app.commands.{module_name}")
        return getattr(module, attribute)

    @override
    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    @staticmethod
    def _module_exists(name: str) -> bool:
        module_name = COMMANDS[name][0]
        return importlib.util.find_spec(f"power.app.commands.{module_name}") is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="power")
def main() -> None:
    """Power: validate, size, plan, render and run speculative-decoding deployments of GGUF models.

    Exit codes: 0 ok, 1 check failures, 2 usage or input error.
    """
