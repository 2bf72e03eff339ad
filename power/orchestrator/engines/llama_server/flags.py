"""llama-server's command line as the pinned llama.cpp defines it: every option's spellings, value, env name.

The table (`llama-server-flags.json`, beside this module) is generated from the real binary
(`scripts/llama-server-flags` parses `llama-server --help` and records, for each
removed option, the error the binary prints), and a test holds it to the binary.
The importer reads launch lines through it (which words are options, which take
a value, what an env variable stands for, what a removed option does at start);
the renderer writes env files through it (`LLAMA_ARG_*` names as `common/arg.cpp`
spells them, and which options have none).

llama.cpp's own rules, kept here: a `--long_option` is read as `--long-option`;
an unknown option stops the server (`error: invalid argument: X`); a removed
option stops it with `error while handling argument "X": <reason>`, and its env
variable with `error while handling environment variable "V": <reason>`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

TABLE = "llama-server-flags.json"
REMOVED_PREFIX = "the argument has been removed"
# How llama.cpp's parser (common/arg.cpp) words its refusals.
INVALID_ARGUMENT = "error: invalid argument: {flag}"
ARGUMENT_ERROR = 'error while handling argument "{flag}": {reason}'
ENV_ERROR = 'error while handling environment variable "{env}": {reason}'
MISSING_VALUE = "expected value for argument"


@dataclass(frozen=True)
class Option:
    spellings: tuple[str, ...]
    value: str | None  # the value's placeholder (`N`, `TYPE`); None for a switch
    env: str | None  # the LLAMA_ARG_* variable that sets it, when it has one
    removed: str | None = None  # what llama-server prints when given it (None: a current option)
    default: str | None = None  # the default its help states (`48`, `-1, -1 = auto`), when it states one

    @property
    def name(self) -> str:
        """The option's long spelling (its first `--` spelling): how Power names it."""
        return next((s for s in self.spellings if s.startswith("--")), self.spellings[0])

    @property
    def takes_value(self) -> bool:
        return self.value is not None

    @property
    def values(self) -> int:
        """How many words follow the option (`--control-vector-layer-range START END` takes two)."""
        if self.value is None:
            return 0
        return 1 if "<" in self.value else len(self.value.split())

    @property
    def default_int(self) -> int | None:
        """The stated default as a whole number (`-1, -1 = auto` -> -1), or None."""
        head = (self.default or "").split(",")[0].strip()
        return int(head) if re.fullmatch(r"-?\d+", head) else None

    @property
    def default_float(self) -> float | None:
        head = (self.default or "").split(",")[0].strip()
        return float(head) if re.fullmatch(r"-?\d+(\.\d+)?", head) else None

    def document(self) -> dict[str, Any]:
        return {"spellings": list(self.spellings), "value": self.value, "env": self.env, "removed": self.removed,
                "default": self.default}


@dataclass(frozen=True)
class Table:
    llama_cpp: str  # the build the table was read from (`llama-server --version`)
    options: tuple[Option, ...]

    @property
    def by_spelling(self) -> dict[str, Option]:
        return _index(self)[0]

    @property
    def by_env(self) -> dict[str, Option]:
        return _index(self)[1]

    def lookup(self, word: str) -> Option | None:
        """The option a command-line word names, as llama.cpp reads it (`--a_b` is `--a-b`), or None."""
        return self.by_spelling.get(normalised(word))

    def option(self, name: str) -> Option:
        """The option spelled `name`; KeyError when the pinned llama.cpp has none (a Power bug, not user input)."""
        found = self.lookup(name)
        if found is None:
            raise KeyError(f"llama-server has no option {name!r}")
        return found

    def document(self) -> dict[str, Any]:
        return {"llama_cpp": self.llama_cpp, "options": [o.document() for o in self.options]}


@cache
def _index(table: Table) -> tuple[dict[str, Option], dict[str, Option]]:
    spellings = {s: o for o in table.options for s in o.spellings}
    envs = {o.env: o for o in table.options if o.env}
    return spellings, envs


def negative(spelling: str) -> bool:
    """Whether a switch's spelling turns its setting off (`--no-kv-unified`, `-no-kvu`)."""
    return spelling.startswith(("--no-", "-no-"))


def normalised(word: str) -> str:
    return word.replace("_", "-") if word.startswith("--") else word


@cache
def table() -> Table:
    """The committed table for the pinned llama.cpp."""
    text = resources.files("power.orchestrator.engines.llama_server").joinpath(TABLE).read_text(encoding="utf-8")
    return from_document(json.loads(text))


def from_document(data: dict[str, Any]) -> Table:
    options = tuple(Option(tuple(o["spellings"]), o["value"], o["env"], o["removed"], o["default"])
                    for o in data["options"])
    return Table(data["llama_cpp"], options)


_OPTION_START = re.compile(r"^-")
_ENV = re.compile(r"\(env: ([A-Z0-9_]+)\)")
_DEFAULT = re.compile(r"\(default: ([^)]*)\)")


def parse_help(text: str) -> list[Option]:
    """The options `llama-server --help` lists, with their env names; `removed` holds the help's own words.

    An option starts on a line beginning with `-`: its spellings separated by
    commas, then the value placeholder, then (after two spaces, or on the next
    line when the head is long) the description, whose `(env: NAME)` names its
    variable.
    """
    options: list[Option] = []
    head: str | None = None
    description: list[str] = []

    def finish() -> None:
        if head is not None:
            options.append(_option(head, " ".join(description)))

    for line in text.splitlines():
        if line.startswith("-----"):
            finish()
            head, description = None, []
        elif _OPTION_START.match(line):
            finish()
            joined = re.sub(r",\s+", ", ", line.rstrip())
            head, _, rest = (re.split(r"(\s{2,})", joined, maxsplit=1) + ["", ""])[:3]
            description = [rest.strip()]
        elif head is not None:
            description.append(line.strip())
    finish()
    return options


def _option(head: str, description: str) -> Option:
    *names, last = head.split(", ")
    spelling, _, value = last.partition(" ")
    env = _ENV.search(description)
    words = _ENV.sub("", description).strip()
    removed = words if words.startswith(REMOVED_PREFIX) else None
    default = _DEFAULT.search(words)
    return Option((*names, spelling), value.strip() or None, env.group(1) if env else None, removed,
                  default.group(1).strip() if default else None)
