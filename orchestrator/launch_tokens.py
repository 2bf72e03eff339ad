"""Located tokens of an existing launch: a command line, an env file or a systemd unit.

Every token keeps the file, line and column it came from, so a launch-line
finding points at the flag the way a TOML finding points at a key. Env-file
variables are turned into the flags they stand for (`LLAMA_ARG_SPEC_TYPE=x`
is `--spec-type x`), keeping their own line.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from power.artifacts.documents import MAX_LAUNCH_BYTES, DocumentError, read_text
from power.findings import PowerError

COMMAND_LINE = "<command line>"

# One shell word: unquoted runs and quoted strings glued together.
_WORD = re.compile(r"""(?:[^\s'"\\]+|\\.|'[^']*'|"(?:\\.|[^"\\])*")+""")
_ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


class LaunchInputError(PowerError):
    """A launch input that cannot be read; the message names the file and the place."""

    code = "PWR459"


@dataclass(frozen=True)
class Token:
    text: str
    file: str
    line: int
    col: int
    source_line: str
    # The env variable this token came from, when it came from one (`LLAMA_ARG_SPEC_TYPE`).
    env: str | None = None


def tokens_from_argv(argv: list[str]) -> list[Token]:
    """The argv as one command line: columns index into its shell-quoted rendering."""
    rendered = shlex.join(argv)
    tokens, col = [], 0
    for word in argv:
        quoted = shlex.quote(word)
        col = rendered.index(quoted, col)
        tokens.append(Token(word, COMMAND_LINE, 1, col + 1, rendered))
        col += len(quoted)
    return tokens


def tokens_from_env_file(path: Path, env_prefix: str | None) -> list[Token]:
    """Flags from `PREFIX_NAME=value` lines, plus any variable whose value is itself a flag list."""
    tokens = []
    for number, line in enumerate(_read(path).splitlines(), start=1):
        tokens += _tokens_from_assignment(line, str(path), number, line, env_prefix)
    return tokens


def tokens_from_systemd_unit(path: Path, env_prefix: str | None) -> list[Token]:
    """`Environment=` and `EnvironmentFile=` variables, then the `ExecStart=` command line."""
    environment, command = [], []
    in_exec = False
    for number, line in enumerate(_read(path).splitlines(), start=1):
        stripped = line.strip()
        if in_exec or stripped.startswith("ExecStart="):
            body = stripped.removeprefix("ExecStart=") if not in_exec else line
            offset = line.index(body) if body else 0
            in_exec = body.rstrip().endswith("\\")
            command += _words(body.rstrip().removesuffix("\\"), str(path), number, line, offset)
        elif stripped.startswith("Environment="):
            offset = line.index("Environment=") + len("Environment=")
            for word in _words(line[offset:], str(path), number, line, offset):
                environment += _tokens_from_assignment(word.text, str(path), number, line, env_prefix, word.col)
        elif stripped.startswith("EnvironmentFile="):
            environment += _environment_file(stripped.removeprefix("EnvironmentFile="), path, env_prefix)
    if not command:
        raise LaunchInputError(f"{path}: no ExecStart= line; point --unit at the service that runs the engine")
    return environment + command


def _environment_file(value: str, unit: Path, env_prefix: str | None) -> list[Token]:
    optional = value.startswith("-")
    env_path = Path(value.removeprefix("-"))
    if not env_path.is_absolute():
        env_path = unit.parent / env_path
    if optional and not env_path.exists():
        return []
    return tokens_from_env_file(env_path, env_prefix)


def _tokens_from_assignment(text: str, file: str, number: int, line: str, env_prefix: str | None,
                            col: int = 1) -> list[Token]:
    match = _ASSIGNMENT.match(text)
    if match is None:
        return []
    name, raw = match.group(1), match.group(2).strip()
    value_col = col + match.start(2) + (len(match.group(2)) - len(match.group(2).lstrip()))
    try:
        words = shlex.split(raw, comments=True)
    except ValueError as err:
        raise LaunchInputError(f"{file}:{number}: cannot read the value of {name} ({err})") from None
    if env_prefix and name.startswith(env_prefix):
        flag = "--" + name.removeprefix(env_prefix).lower().replace("_", "-")
        value = " ".join(words)
        return [Token(flag, file, number, col, line, env=name), Token(value, file, number, value_col, line, env=name)]
    # A quoted flag list (`ARGS="--a 1 --b 2"`) is one shell word holding the words of the command line.
    flags = shlex.split(" ".join(words)) if words else []
    if flags and flags[0].startswith("-"):
        return _located(flags, file, number, line, value_col - 1)
    return []


def _located(words: list[str], file: str, number: int, line: str, start: int) -> list[Token]:
    """Tokens for words already unquoted from `line`, each at its first occurrence after the previous one."""
    tokens = []
    for word in words:
        found = line.find(word, start)
        col = found if found >= 0 else start
        tokens.append(Token(word, file, number, col + 1, line))
        start = col + len(word)
    return tokens


def _words(text: str, file: str, number: int, line: str, offset: int) -> list[Token]:
    tokens = []
    for match in _WORD.finditer(text):
        raw = match.group(0)
        if raw.startswith("#"):
            break
        try:
            [value] = shlex.split(raw) or [""]
        except ValueError as err:
            raise LaunchInputError(f"{file}:{number}:{offset + match.start() + 1}: cannot read {raw!r} ({err})") from None
        tokens.append(Token(value, file, number, offset + match.start() + 1, line))
    return tokens


def _read(path: Path) -> str:
    try:
        return read_text(path, MAX_LAUNCH_BYTES)
    except DocumentError as err:
        raise LaunchInputError.of(err.finding("PWR459", path, "pass the env file or unit that launches the engine",
                                              what="the launch file")) from None
