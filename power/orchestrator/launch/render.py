"""Launch artifacts from a resolved plan: llama-server (a script and its LLAMA_ARG_* env file), vLLM, the Power
runtime, a POWER_* env file, a systemd drop-in.

The templates under `templates/` lay the artifacts out; this module decides what
goes in them. `engine_launch` is the one source of an engine's command line: it
asks the engine's adapter (`power.orchestrator.engines`) whether it can run the
plan, refuses a plan sized for another engine, then takes the adapter's line: the
shell templates print it, the llama-server env file spells the same options as
the variables llama.cpp's `common/arg.cpp` names (`engines.llama_server.flags`),
the Kubernetes render puts the same words in a container's command, and
`power bench --engine` launches exactly it. A rendered engine runs what the plan
says: every setting whose engine default differs from the plan is written (slots
and unified KV, batch and micro-batch, the n-gram's match and draft lengths, the
confidence gate, the sampler chain, /metrics). Every value that reaches a shell
line passes through `shlex.quote`; every value that reaches a systemd unit is
double-quoted the way systemd.syntax(7) unquotes it (`systemd_assignment`,
`systemd_word`), and the unit starts Power by absolute path; every value that
reaches a comment has its line breaks escaped. A plan feature an engine has no
flag for (S snapshots, FR, the adaptive controller, the fixed verification shape)
is said in a comment, never invented as a flag; a mode or artifact an engine
cannot run is refused (RenderError), never downgraded.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from power.documents.plan import ResolvedPlan
from power.findings import PowerError
from power.orchestrator.engines import ENGINES, TARGET_ENGINES, Asked, Launch, adapter
from power.orchestrator.engines.llama_server import flags as llama_flags
from power.orchestrator.engines.power.adapter import PowerRuntime

if TYPE_CHECKING:
    import jinja2

TARGETS = tuple(TARGET_ENGINES)

POWER = PowerRuntime()
# The variable a llama-server env file puts the options without an LLAMA_ARG_* name in (the serve script
# passes it unquoted: `exec llama-server $LLAMA_SERVER_EXTRA_ARGS`).
EXTRA_ARGS = "LLAMA_SERVER_EXTRA_ARGS"


class RenderError(PowerError):
    """The plan asks for something the chosen engine cannot run; the message says which target can."""

    code = "PWR460"


def _environment() -> jinja2.Environment:
    import jinja2  # here, not at import: `power <command> --help` and the commands that render nothing never load it

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("power.orchestrator", "templates"),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["q"] = lambda value: shlex.quote(str(value))
    env.filters["systemd_assignment"] = systemd_assignment
    env.filters["systemd_word"] = systemd_word
    env.filters["comment"] = comment_safe
    return env


def systemd_assignment(name: str, value: object) -> str:
    """One `Environment=` assignment that systemd reads back as exactly NAME=value.

    Environment= splits double-quoted words and interprets C escapes in them, expands
    `%specifiers` but never `$`: so `\\`, `"` and control characters are escaped, `%` doubled,
    `$` left alone (doubling it would put `$$` in the service's environment).
    """
    return '"' + _systemd_escaped(f"{name}={value}", dollar="$") + '"'


def systemd_word(value: object) -> str:
    """One `ExecStart=` word that systemd reads back as exactly `value`: as in an assignment, and `$`
    doubled, since ExecStart= expands `$VAR`. Quoted, so a lone `;` stays an argument."""
    return '"' + _systemd_escaped(str(value), dollar="$$") + '"'


def _systemd_escaped(text: str, dollar: str) -> str:
    escaped = {"\\": "\\\\", '"': '\\"', "%": "%%", "$": dollar, "\n": "\\n", "\t": "\\t"}
    return "".join(escaped.get(ch) or (f"\\x{ord(ch):02x}" if ord(ch) < 32 or ord(ch) == 127 else ch) for ch in text)


def power_executable() -> str | None:
    """The `power` console script beside this interpreter (the installed one), else the first on PATH."""
    beside = Path(sys.executable).with_name("power")
    if beside.is_file():
        return str(beside)
    found = shutil.which("power")
    return str(Path(found).resolve()) if found else None


def comment_safe(value: object) -> str:
    """Text that cannot end the comment line it is put in."""
    return str(value).replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n")


@dataclass(frozen=True)
class Listen:
    """Where a served engine binds (a container binds every address; the shell renders keep the engine's default)."""

    host: str
    port: int


def render(plan: ResolvedPlan, target: str, plan_path: Path, root: Path | None = None,
           executable: str | None = None, listen: Listen | None = None, api_key_file: str | None = None) -> str:
    """The `target` launch for `plan`, whose artifact paths are as given (`power.documents.plan.located`);
    a Power launch passes `root` on to `power serve`; `executable` is the absolute path of `power` a systemd
    unit starts (default: `power_executable()`); `listen` (an engine's address) is written when given, else the
    engine's own default; `api_key_file` (a file on the serving machine) is how the engine finds its API key
    (`with_api_key`)."""
    if target not in TARGETS:
        raise RenderError(f"unknown render target {target!r}; choose one of {', '.join(TARGETS)}")
    plan_path = Path(plan_path).resolve()
    _power_only(plan, target)
    sized_for(plan, TARGET_ENGINES[target])
    if target in ENGINES:
        context = {"launch": with_api_key(engine_launch(plan, target, plan_path, listen, root=root), target,
                                          api_key_file)}
    elif target == "llama-server-env":
        engine = TARGET_ENGINES[target]
        launch = with_api_key(engine_launch(plan, engine, plan_path, listen), engine, api_key_file)
        context = llama_server_env_context(launch)
    elif target == "systemd":
        context = systemd_context(plan, plan_path, executable, root, api_key_file)
    else:
        context = env_file_context(plan, plan_path)
    template = _environment().get_template(f"{target}.j2")
    return template.render(plan=plan, plan_path=str(plan_path), root=str(Path(root).resolve()) if root else None,
                           **context)


def engine_launch(plan: ResolvedPlan, engine: str, plan_path: Path, listen: Listen | None = None,
                  root: Path | None = None, measuring: bool = False) -> Launch:
    """The command line that runs `plan` on `engine` (power | llama-server | vllm); RenderError if it cannot.

    `root`: where `power serve` looks for the artifacts (`--root`); the other engines are given their paths.
    `measuring`: `power bench --engine` measures a plan on another engine than it was sized for, and says so; every
    other caller gets PWR464 for that.
    """
    if engine not in ENGINES:
        raise RenderError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if not measuring:
        sized_for(plan, engine)
    runner = adapter(engine)
    refusals = runner.supports(Asked.of_plan(plan))
    if refusals:
        first = refusals[0]
        raise RenderError(code=first.code, message=f"{runner.description} cannot run this plan: {first.message}",
                          hint=f"{first.hint} (`power plan --engine ENGINE`), then render that plan")
    launch = runner.launch(plan, plan_path, root)
    if listen is None:
        return launch
    address = (("--host", listen.host), ("--port", str(listen.port)))
    return replace(launch, options=launch.options + address)


def with_api_key(launch: Launch, engine: str, key_file: str | None) -> Launch:
    """The launch that makes `engine` require the API key held in `key_file`, the engine's own way (its adapter's
    `api_key_env`: a variable the launch fills from the file when it starts, else `--api-key-file`). The key itself
    is never written into what is rendered."""
    if key_file is None:
        return launch
    variable = adapter(engine).api_key_env
    if variable is not None:
        return replace(launch, secret_files=launch.secret_files | {variable: key_file})
    return replace(launch, options=launch.options + (("--api-key-file", key_file),))


def _power_only(plan: ResolvedPlan, target: str) -> None:
    """The systemd unit and the POWER_* env file start Power's runtime; for another engine's plan, say so and name the
    target that deploys that engine (PWR464), rather than only that the memory would differ."""
    engine = plan.memory.engine
    if target not in ("systemd", "env") or not sized_elsewhere(plan, TARGET_ENGINES[target]):
        return
    runner = adapter(engine)
    own = runner.env_target or runner.targets[0]
    how = (f"render `--target {own} -o FILE` and start {engine} from your own unit"
           + (" with EnvironmentFile=FILE" if runner.env_target else ""))
    raise RenderError(code="PWR464", message=f"--target {target} renders for `power serve` (Power's runtime) only, and "
                      f"this plan was sized for {adapter(engine).description}", hint=how)


def sized_elsewhere(plan: ResolvedPlan, engine: str) -> bool:
    return plan.memory.engine != engine


def sized_for(plan: ResolvedPlan, engine: str) -> None:
    """RenderError (PWR464) unless the plan was sized for `engine`: another engine allocates other memory, so the
    plan's verdict would not hold for what runs."""
    if sized_elsewhere(plan, engine):
        raise RenderError(code="PWR464", message=f"this plan was sized for {adapter(plan.memory.engine).description}; "
                          f"{adapter(engine).description} allocates other memory, so its verdict would not hold",
                          hint=f"plan it for this engine (`power plan MANIFEST PROFILE --engine {engine} ...`), then "
                          "render that plan")


def llama_server_env_context(launch: Launch) -> dict:
    """The llama-server command line as LLAMA_ARG_* variables; options llama.cpp gives no variable go in EXTRA_ARGS."""
    table = llama_flags.table()
    variables: dict[str, object] = dict(launch.env)
    extra: list[str] = []
    for option in launch.options:
        flag, values = option[0], option[1:]
        env = table.option(flag).env
        if env is None:
            extra += option
        elif not values:
            variables[env] = "false" if llama_flags.negative(flag) else "true"
        else:
            variables[env] = " ".join(values)
    unsplittable = [word for word in extra if not word or any(ch.isspace() or ch in "'\"\\$" for ch in word)]
    if unsplittable:
        raise RenderError(code="PWR461", message=f"{EXTRA_ARGS} would carry {unsplittable[0]!r}, which a serve "
                          "script's word splitting cannot pass as one argument", hint="use --target llama-server")
    if extra:
        variables[EXTRA_ARGS] = " ".join(extra)
    _carried_by_env_file(variables)
    return {"variables": variables, "notes": launch.notes, "extra": EXTRA_ARGS}


def env_file_context(plan: ResolvedPlan, plan_path: Path) -> dict:
    """The POWER_* variables of the env file."""
    context = env_context(plan, plan_path)
    _carried_by_env_file(context["variables"])
    return context


def _carried_by_env_file(variables: dict[str, object]) -> None:
    """RenderError (PWR461) for a value with a control character: shell-quoted env file text cannot carry it."""
    for name, value in variables.items():
        if any(ord(ch) < 32 for ch in str(value)):
            raise RenderError(code="PWR461", message=f"{name} ({str(value)!r}) contains a control character, which "
                              "an env file cannot carry; rename it in the manifest and recompile the plan")


def systemd_context(plan: ResolvedPlan, plan_path: Path, executable: str | None, root: Path | None,
                    api_key_file: str | None = None) -> dict:
    """The plan's environment, and Power's own command line with `power` as an absolute path (systemd runs no
    shell and, before v239, resolves no PATH)."""
    executable = executable or power_executable()
    if executable is None or not Path(executable).is_absolute():
        raise RenderError(code="PWR462", message=f"the systemd unit needs the absolute path of the power executable, "
                          f"and {'none was found' if executable is None else repr(executable) + ' is not one'}",
                          hint="pass --power-executable /path/to/power (e.g. `command -v power`)")
    argv = with_api_key(engine_launch(plan, POWER.name, plan_path, root=root), POWER.name, api_key_file).argv
    return {**env_context(plan, plan_path), "exec_start": [executable, *argv[1:]]}


def env_context(plan: ResolvedPlan, plan_path: Path) -> dict:
    return {"variables": POWER.variables(plan, plan_path)}
