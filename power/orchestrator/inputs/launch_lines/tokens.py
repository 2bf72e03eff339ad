"""Located tokens of an existing launch: a command line, an env file or a systemd unit.

Every token keeps the file, line and column it came from, so a launch-line
finding points at the flag the way a TOML finding points at a key. Env-file
variables the engine reads (`LLAMA_ARG_SPEC_TYPE=x`) become the option they
set, keeping their own line and the variable's name. In a systemd unit,
`ExecStart=` is expanded the way systemd does it: `$VAR` standing alone
becomes the variable's words, `${VAR}` its value inside a word, `$$` a `$`; a
variable the unit does not define expands to nothing (a lone `$VAR` to no word) and is marked unresolved.

Bounds, beside the reader's (each file a regular UTF-8 file of at most 1 MiB):
a line at most MAX_LINE_CHARS characters (the shell-word reader is slow per character), at most MAX_ENVIRONMENT_FILES
`EnvironmentFile=` lines in a unit, and an `ExecStart=` line at most
MAX_EXPANDED_CHARS characters once its variables are put in (`$A $A $A ...`
would otherwise multiply a unit's size by the size of `A`).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from power.artifacts.bounded_reader import MAX_LAUNCH_BYTES, DocumentError, read_text
from power.findings import PowerError

COMMAND_LINE = "<command line>"
MAX_LINE_CHARS = 64 << 10  # a real engine setting or flag list is a few hundred characters
MAX_ENVIRONMENT_FILES = 32
MAX_EXPANDED_CHARS = MAX_LAUNCH_BYTES

# One shell word: unquoted runs and quoted strings glued together.
_WORD = re.compile(r"""(?:[^\s'"\\]+|\\.|'[^']*'|"(?:\\.|[^"\\])*")+""")
_ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_LONE_VARIABLE = re.compile(r"^\$([A-Za-z_][A-Za-z0-9_]*)$")
_VARIABLE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


class LaunchInputError(PowerError):
    """A launch input that cannot be read; the message names the file and the place."""

    code = "PWR459"


@dataclass(frozen=True)
class EnvNames:
    """How an engine reads its environment: a variable prefix and, per variable it knows, the option it sets."""

    prefix: str
    options: Mapping[str, str]  # `LLAMA_ARG_CTX_SIZE` -> `--ctx-size`


@dataclass(frozen=True)
class Token:
    text: str
    file: str
    line: int
    col: int
    source_line: str
    # The env variable this token came from, when it came from one (`LLAMA_ARG_SPEC_TYPE`). A variable with the
    # engine's prefix that names no option it knows keeps the variable's name as its text.
    env: str | None = None
    # A `$VAR` in a unit's ExecStart that the unit does not define: systemd expands it to nothing.
    unresolved: str | None = None


@dataclass(frozen=True)
class _Assignment:
    name: str
    words: list[str]  # the value, unquoted into shell words
    file: str
    line: int
    col: int  # where the assignment starts
    value_col: int  # where its value starts
    source_line: str


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


def tokens_from_env_file(path: Path, env: EnvNames | None) -> list[Token]:
    """Options from the engine's own variables, plus any variable whose value is itself a flag list."""
    tokens = []
    for assignment in _env_file_assignments(path):
        tokens += _env_tokens(assignment, env) or _flag_list(assignment)
    return tokens


def tokens_from_systemd_unit(path: Path, env: EnvNames | None) -> list[Token]:
    """The engine's variables from `Environment=` and `EnvironmentFile=`, then the expanded `ExecStart=` line."""
    assignments: list[_Assignment] = []
    command: list[tuple[str, int, str, int]] = []  # (body, line number, line, offset)
    in_exec, environment_files = False, 0
    for number, line in _lines(path):
        stripped = line.strip()
        if in_exec or stripped.startswith("ExecStart="):
            body = stripped.removeprefix("ExecStart=") if not in_exec else line
            offset = line.index(body) if body else 0
            in_exec = body.rstrip().endswith("\\")
            command.append((body.rstrip().removesuffix("\\"), number, line, offset))
        elif stripped.startswith("Environment="):
            offset = line.index("Environment=") + len("Environment=")
            for word in _words(line[offset:], str(path), number, line, offset):
                assignment = _assignment(word.text, str(path), number, line, word.col)
                if assignment is not None:
                    assignments.append(assignment)
        elif stripped.startswith("EnvironmentFile="):
            environment_files += 1
            if environment_files > MAX_ENVIRONMENT_FILES:
                raise LaunchInputError(f"{path}:{number}:1: more than {MAX_ENVIRONMENT_FILES} EnvironmentFile= lines; "
                                       "a unit that launches one engine needs a few")
            assignments += _environment_file(stripped.removeprefix("EnvironmentFile="), path)
    if not command:
        raise LaunchInputError(f"{path}: no ExecStart= line; point --unit at the service that runs the engine")
    variables = {a.name: a.words for a in assignments}
    tokens = [token for a in assignments for token in _env_tokens(a, env)]
    for body, number, line, offset in command:
        tokens += _expanded(_words(body, str(path), number, line, offset), variables)
    return tokens


def _expanded(words: list[_RawToken], variables: dict[str, list[str]]) -> list[Token]:
    """ExecStart words with the unit's variables put in, as systemd does (systemd.service(5), "Command lines")."""
    tokens, size = [], 0
    for word in words:
        lone = _LONE_VARIABLE.match(word.raw)
        if lone and lone.group(1) in variables:
            text = " ".join(variables[lone.group(1)])
            size = _spend(size, len(text), word)
            tokens += [_at(word, piece) for piece in text.split()]
            continue
        text, missing = _substituted(word.text, variables, size, word)
        size = _spend(size, len(text), word)
        tokens.append(Token(text, word.file, word.line, word.col, word.source_line, unresolved=missing))
    return tokens


def _spend(size: int, more: int, word: Token) -> int:
    if size + more > MAX_EXPANDED_CHARS:
        raise LaunchInputError(f"{word.file}:{word.line}:{word.col}: ExecStart= expands past {MAX_EXPANDED_CHARS:,} "
                               "characters once its variables are put in; no engine command line is that long")
    return size + more


def _substituted(text: str, variables: dict[str, list[str]], used: int, word: Token) -> tuple[str, str | None]:
    """`text` with `${VAR}` and `$VAR` put in and `$$` made `$`, a variable the unit lacks as nothing (as systemd
    does); the first variable the unit lacks, if any. Refused
    as soon as what was put in passes the expansion bound, counting the `used` characters before this word."""
    missing: list[str] = []
    grown = used

    def put(match: re.Match) -> str:
        nonlocal grown
        if match.group(0) == "$$":
            return "$"
        name = match.group(1) or match.group(2)
        if name not in variables:
            missing.append(name)
            return ""
        value = " ".join(variables[name])
        grown = _spend(grown, len(value), word)
        return value

    return _VARIABLE.sub(put, text), missing[0] if missing else None


def _at(word: "_RawToken", text: str) -> Token:
    return Token(text, word.file, word.line, word.col, word.source_line)


def _environment_file(value: str, unit: Path) -> list[_Assignment]:
    optional = value.startswith("-")
    env_path = Path(value.removeprefix("-"))
    if not env_path.is_absolute():
        env_path = unit.parent / env_path
    if optional and not env_path.exists():
        return []
    return _env_file_assignments(env_path)


def _env_file_assignments(path: Path) -> list[_Assignment]:
    found = []
    for number, line in _lines(path):
        assignment = _assignment(line, str(path), number, line)
        if assignment is not None:
            found.append(assignment)
    return found


def _assignment(text: str, file: str, number: int, line: str, col: int = 1) -> _Assignment | None:
    match = _ASSIGNMENT.match(text)
    if match is None:
        return None
    name, raw = match.group(1), match.group(2).strip()
    value_col = col + match.start(2) + (len(match.group(2)) - len(match.group(2).lstrip()))
    try:
        words = shlex.split(raw, comments=True)
    except ValueError as err:
        raise LaunchInputError(f"{file}:{number}:{value_col}: cannot read the value of {name} ({err})") from None
    return _Assignment(name, words, file, number, col, value_col, line)


def _env_tokens(assignment: _Assignment, env: EnvNames | None) -> list[Token]:
    """The option an engine variable sets, and its value (`LLAMA_ARG_CTX_SIZE=8192` -> `--ctx-size 8192`)."""
    if env is None or not assignment.name.startswith(env.prefix):
        return []
    a = assignment
    flag = env.options.get(a.name, a.name)
    return [Token(flag, a.file, a.line, a.col, a.source_line, env=a.name),
            Token(" ".join(a.words), a.file, a.line, a.value_col, a.source_line, env=a.name)]


def _flag_list(assignment: _Assignment) -> list[Token]:
    """A quoted flag list (`ARGS="--a 1 --b 2"`) is one shell word holding the words of the command line."""
    a = assignment
    try:
        flags = shlex.split(" ".join(a.words)) if a.words else []
    except ValueError as err:
        raise LaunchInputError(f"{a.file}:{a.line}:{a.value_col}: cannot read the flag list in {a.name} ({err}); "
                               "balance its quotes") from None
    if flags and flags[0].startswith("-"):
        return _located(flags, a.file, a.line, a.source_line, a.value_col - 1)
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


@dataclass(frozen=True)
class _RawToken(Token):
    raw: str = ""  # the word as written, quotes included


def _words(text: str, file: str, number: int, line: str, offset: int) -> list[_RawToken]:
    tokens = []
    for match in _WORD.finditer(text):
        raw = match.group(0)
        if raw.startswith("#"):
            break
        try:
            [value] = shlex.split(raw) or [""]
        except ValueError as err:
            raise LaunchInputError(
                f"{file}:{number}:{offset + match.start() + 1}: cannot read {raw!r} ({err})"
            ) from None
        tokens.append(_RawToken(value, file, number, offset + match.start() + 1, line, raw=raw))
    return tokens


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """The file's numbered lines, each at most MAX_LINE_CHARS characters (refused, located, past that)."""
    for number, line in enumerate(_read(path).splitlines(), start=1):
        if len(line) > MAX_LINE_CHARS:
            raise LaunchInputError(f"{path}:{number}:1: the line has {len(line):,} characters; a line may have at most "
                                   f"{MAX_LINE_CHARS:,} (split a long ExecStart= with a trailing backslash)")
        yield number, line


def _read(path: Path) -> str:
    try:
        return read_text(path, MAX_LAUNCH_BYTES)
    except DocumentError as err:
        raise LaunchInputError.of(err.finding("PWR459", path, "pass the env file or unit that launches the engine",
                                              what="the launch file")) from None
