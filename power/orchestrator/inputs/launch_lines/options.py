"""What `power import` does with an engine's option: carried, refused (with the fix), or of no effect on the plan.

Each engine's folder keeps its table of rows (`engines.llama_server.options`, one per option of the pinned binary;
`engines.vllm.options`, the arguments Power reads); `refusal` is the finding for a refused option, the same for every
engine:

- carried: read into the LaunchSpec attribute the engine's settings table names for it, then into the manifest,
  profile or plan with the same meaning (the render writes it back);
- refused: a finding naming the option, with the fix: PWR444 where the deployment would run something other than
  the plan says, PWR447 for a model to download, the warning PWR446 where only a request default or a setting the
  render takes elsewhere is lost; `accepts` lists values that are the engine's own default, which change nothing and
  are not refused;
- no effect: it changes neither what is loaded, nor where, nor what a greedy request returns.
"""

from __future__ import annotations

from dataclasses import dataclass

from power import codes
from power.findings import Finding, Severity
from power.orchestrator.inputs.launch_lines.spec import finding
from power.orchestrator.inputs.launch_lines.tokens import Token

# the codes of a refusal: what would run differs from the plan (an error); only a request default or a setting the
# render takes elsewhere is lost (a warning); a model to download at start
REFUSE, WARN, FETCH = "PWR444", "PWR446", "PWR447"
CARRIED = "carried"
REFUSED = "refused"
NO_EFFECT = "no effect"


@dataclass(frozen=True)
class Row:
    option: str  # the option's long spelling (llama-server: `flags.Option.name`)
    disposition: str
    meaning: str  # what it does in the engine; for a refusal, why Power cannot hold it
    fix: str | None = None  # refused: what to write instead
    code: str = REFUSE  # refused: the finding's code (PWR446 a warning, PWR447 a model to download)
    accepts: tuple[str, ...] = ()  # refused: values (or `on`/`off` for a switch) that are the engine's default

    def accepted(self, value: str) -> bool:
        """Whether `value` is one of the defaults a refused option may be given (numbers compare as numbers)."""
        return any(value == allowed or _same_number(value, allowed) for allowed in self.accepts)


def _same_number(a: str, b: str) -> bool:
    try:
        return float(a) == float(b)
    except ValueError:
        return False


def carried(option: str, meaning: str) -> Row:
    return Row(option, CARRIED, meaning)


def refused(option: str, meaning: str, fix: str, code: str = REFUSE, accepts: tuple[str, ...] = ()) -> Row:
    return Row(option, REFUSED, meaning, fix=fix, code=code, accepts=accepts)


def no_effect(option: str, meaning: str) -> Row:
    return Row(option, NO_EFFECT, meaning)


def refusal(row: Row, flag: Token, said: str, value: str, show_value: bool) -> list[Finding]:
    """The finding for an option Power cannot carry (`said` as the line wrote it), unless `value` is the engine's own
    default."""
    if row.accepted(value):
        return []
    return [finding(row.code, flag, f"{said}{' ' + value if show_value else ''}: {row.meaning}", str(row.fix),
                    Severity(codes.CODES[row.code][0]))]
