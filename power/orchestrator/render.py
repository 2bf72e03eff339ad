"""Launch artifacts from a resolved plan: llama-server (a script and its LLAMA_ARG_* env file), vLLM, the Power
runtime, a POWER_* env file, a systemd drop-in.

The templates under `templates/` lay the artifacts out; this module decides what
goes in them. `engine_launch` is the one source of an engine's command line: the
shell templates print it, the llama-server env file spells the same options as
the variables llama.cpp's `common/arg.cpp` names (`power.orchestrator.llama_flags`),
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

import json
import shlex
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import jinja2

from power import modes
from power.documents.plan import ResolvedPlan
from power.findings import PowerError
from power.orchestrator import llama_flags
from power.orchestrator.sizing.model import ENGINES

TARGETS = ("llama-server", "llama-server-env", "vllm", "power", "env", "systemd")

# vLLM's --kv-cache-dtype has no llama.cpp block types: f16/bf16 map to the model dtype.
VLLM_KV_DTYPES = {"f16": "auto", "bf16": "auto", "f32": "auto"}
# The variable a llama-server env file puts the options without an LLAMA_ARG_* name in (the serve script
# passes it unquoted: `exec llama-server $LLAMA_SERVER_EXTRA_ARGS`).
EXTRA_ARGS = "LLAMA_SERVER_EXTRA_ARGS"


class RenderError(PowerError):
    """The plan asks for something the chosen engine cannot run; the message says which target can."""

    code = "PWR460"


def _environment() -> jinja2.Environment:
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


@dataclass(frozen=True)
class Launch:
    """An engine's command line: the program words, then each option with its value(s), the environment it needs,
    and the plan features the engine has no flag for."""

    program: tuple[str, ...]
    options: tuple[tuple[str, ...], ...]
    env: dict[str, str]
    notes: tuple[str, ...]

    @property
    def argv(self) -> list[str]:
        return [*self.program, *(word for option in self.options for word in option)]


def render(plan: ResolvedPlan, target: str, plan_path: Path, root: Path | None = None,
           executable: str | None = None, listen: Listen | None = None) -> str:
    """The `target` launch for `plan`, whose artifact paths are as given (`power.documents.plan.located`);
    a Power launch passes `root` on to `power serve`; `executable` is the absolute path of `power` a systemd
    unit starts (default: `power_executable()`); `listen` (an engine's address) is written when given, else the
    engine's own default."""
    if target not in TARGETS:
        raise RenderError(f"unknown render target {target!r}; choose one of {', '.join(TARGETS)}")
    plan_path = Path(plan_path).resolve()
    if target in ENGINES:
        context = {"launch": engine_launch(plan, target, plan_path, listen, root=root)}
    elif target == "llama-server-env":
        context = llama_server_env_context(engine_launch(plan, "llama-server", plan_path, listen))
    elif target == "systemd":
        context = systemd_context(plan, plan_path, executable, root)
    else:
        context = env_file_context(plan, plan_path)
    template = _environment().get_template(f"{target}.j2")
    return template.render(plan=plan, plan_path=str(plan_path), root=str(Path(root).resolve()) if root else None,
                           **context)


def engine_launch(plan: ResolvedPlan, engine: str, plan_path: Path, listen: Listen | None = None,
                  root: Path | None = None) -> Launch:
    """The command line that runs `plan` on `engine` (power | llama-server | vllm); RenderError if it cannot.

    `root`: where `power serve` looks for the artifacts (`--root`); the other engines are given their paths.
    """
    if engine not in ENGINES:
        raise RenderError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if engine == "power":
        launch = power_launch(plan_path)
        if root is not None:
            launch = replace(launch, options=launch.options + (("--root", str(Path(root).resolve())),))
    else:
        launch = llama_server_launch(plan) if engine == "llama-server" else vllm_launch(plan)
    if listen is None:
        return launch
    address = (("--host", listen.host), ("--port", str(listen.port)))
    return Launch(launch.program, launch.options + address, launch.env, launch.notes)


def _options(pairs: list[tuple[str, object]]) -> tuple[tuple[str, ...], ...]:
    """(flag, value) pairs as option words; a None value is a switch (the flag alone)."""
    return tuple((flag,) if value is None else (flag, str(value)) for flag, value in pairs)


def unsupported_notes(plan: ResolvedPlan) -> list[str]:
    """Plan settings no external engine has a flag for."""
    spec = plan.speculation
    notes = []
    if spec.rollback != "none" and plan.target.recurrent_layers:
        notes.append(f"S = {spec.s} recurrent snapshots ({spec.rollback} rollback): no flag; the engine keeps its own rollback state")
    if spec.fr_vocab_size:
        notes.append(f"FR = {spec.fr_vocab_size} draft-only token-ID prefix: no flag; the draft head projects the full vocabulary")
    if spec.adaptive:
        notes.append("adaptive K/S controller: no flag; the engine drafts a fixed K per round")
    notes.append(f"fixed verification capacity {plan.runtime.verify_capacity} rows: no flag")
    return notes


def llama_server_launch(plan: ResolvedPlan) -> Launch:
    chain = plan.mode.chain
    for kind in chain:
        if modes.mode(kind).reserved:
            raise RenderError(f"`{kind}` is reserved and has no production adapter; nothing to render")
        if modes.llama_spec_type(kind) is None:
            raise RenderError(f"llama-server has no {kind} speculative type; render this plan with --target power")
    rt, sampling = plan.runtime, plan.sampling
    args: list[tuple[str, object]] = [
        ("-m", plan.target.path),
        ("--alias", plan.name),
        ("-c", rt.ctx),
        ("-np", rt.slots),
        ("--kv-unified" if rt.kv_unified else "--no-kv-unified", None),
        ("-b", rt.batch),
        ("-ub", rt.ubatch),
        ("-ngl", rt.gpu_layers),
        ("-fa", "on" if rt.flash_attn else "off"),
        ("-ctk", rt.kv_cache_type),
        ("-ctv", rt.kv_cache_type),
        ("--seed", sampling.seed),
        ("--temp", sampling.temperature),
        # Power samples from the plain temperature distribution: llama.cpp's default top-k/top-p/min-p cuts are off.
        ("--top-k", 0),
        ("--top-p", 1.0),
        ("--min-p", 0.0),
        # the counters the A/B protocol and the fleet read (llama-server serves /metrics only when asked)
        ("--metrics", None),
    ]
    if chain:
        args.append(("--spec-type", ",".join(str(modes.llama_spec_type(kind)) for kind in chain)))
    drafting = [d for d in plan.drafters if d.kind not in modes.WEIGHT_FREE]
    if drafting:
        args.append(("--spec-draft-n-max", plan.speculation.k))
        args += [("--spec-draft-type-k", rt.draft_kv_cache_type), ("--spec-draft-type-v", rt.draft_kv_cache_type)]
        if rt.draft_device is not None:
            args.append(("--spec-draft-device", rt.draft_device))
        if plan.speculation.p_min is not None:
            args.append(("--spec-draft-p-min", plan.speculation.p_min))
    args += [("--spec-draft-model", d.path) for d in drafting if d.path is not None]
    if any(kind in modes.WEIGHT_FREE for kind in chain):
        args += [("--spec-ngram-mod-n-match", rt.ngram_match), ("--spec-ngram-mod-n-min", rt.ngram_draft_min),
                 ("--spec-ngram-mod-n-max", rt.ngram_draft_max)]
    args += llama_split_options(plan)
    notes = unsupported_notes(plan) if chain else []
    env = {"GGML_CUDA_DISABLE_GRAPHS": "1"} if not rt.cuda_graphs else {}
    return Launch(("llama-server",), _options(args), env | visible_devices(plan), tuple(notes))


def llama_split_options(plan: ResolvedPlan) -> list[tuple[str, object]]:
    """Several devices: the layer split the plan was sized for (-sm layer -ts, one ratio per device in order),
    or the main device alone (-sm none -mg)."""
    rt = plan.runtime
    if len(plan.devices) < 2:
        return []
    if rt.split_mode == "none":
        return [("-sm", "none"), ("-mg", rt.main_gpu)]
    return [("-sm", "layer"), ("-ts", ",".join(f"{r:g}" for r in rt.tensor_split or ()))]


def visible_devices(plan: ResolvedPlan) -> dict[str, str]:
    """The host devices the plan was sized for, as the engine's CUDA device list (so it uses no other GPU);
    nothing for a plan on the host's first device alone."""
    indices = [d.index for d in plan.devices if d.kind == "gpu"]
    return {} if indices in ([], [0]) else {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in indices)}


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


def vllm_launch(plan: ResolvedPlan) -> Launch:
    chain = plan.mode.chain
    if len(chain) > 1:
        raise RenderError(f"vLLM runs one speculative method; this plan chains {' + '.join(chain)}: "
                          "render with --target llama-server or --target power")
    if chain and modes.vllm_method(chain[0]) is None:
        raise RenderError(f"vLLM has no {chain[0]} speculative method; render this plan with --target power")
    if chain and modes.mode(chain[0]).vllm_refusal:
        raise RenderError(code="PWR463", message=str(modes.mode(chain[0]).vllm_refusal),
                          hint="render this plan with --target llama-server or --target power")
    if any(d.path is not None and modes.mode(d.kind).sidecar for d in plan.drafters):
        raise RenderError(code="PWR463", message="vLLM reads an MTP head from the target checkpoint; this plan's "
                          "head is a separate MTP-only GGUF, which vLLM cannot attach",
                          hint="render this plan with --target llama-server or --target power")
    rt = plan.runtime
    args: list[tuple[str, object]] = [("--served-model-name", plan.name), ("--max-model-len", rt.ctx),
                                      ("--max-num-seqs", rt.slots), ("--max-num-batched-tokens", rt.batch),
                                      ("--seed", plan.sampling.seed),
                                      # the model's generation_config.json would override the plan's sampling
                                      ("--generation-config", "vllm")]
    notes = []
    if rt.kv_cache_type in VLLM_KV_DTYPES:
        args.append(("--kv-cache-dtype", VLLM_KV_DTYPES[rt.kv_cache_type]))
    else:
        notes.append(f"kv cache type {rt.kv_cache_type}: vLLM has no such --kv-cache-dtype; it uses the model dtype")
    if chain:
        config, config_notes = speculative_config(plan)
        args.append(("--speculative-config", json.dumps(config, sort_keys=True)))
        notes += config_notes + unsupported_notes(plan)
    if rt.tensor_parallel > 1:
        args.append(("--tensor-parallel-size", rt.tensor_parallel))
    flags = (("--enforce-eager",),) if not rt.cuda_graphs else ()
    return Launch(("vllm", "serve", plan.target.path), flags + _options(args), visible_devices(plan), tuple(notes))


def speculative_config(plan: ResolvedPlan) -> tuple[dict, list[str]]:
    kind = plan.mode.chain[0]
    config: dict[str, object] = {"method": modes.vllm_method(kind), "num_speculative_tokens": plan.speculation.k}
    notes = []
    if kind in modes.WEIGHT_FREE:
        rt = plan.runtime
        # vLLM's prompt lookup tries match lengths from max down to min: one length is llama.cpp's n-match.
        config |= {"prompt_lookup_min": rt.ngram_match, "prompt_lookup_max": rt.ngram_match,
                   "num_speculative_tokens": rt.ngram_draft_max}
        if rt.ngram_draft_min and rt.ngram_draft_min > 1:
            notes.append(f"n-gram shortest draft {rt.ngram_draft_min}: vLLM has no such setting; it proposes "
                         "shorter continuations too")
    return config, notes


def power_launch(plan_path: Path) -> Launch:
    return Launch(("power", "serve", str(plan_path)), (), {}, ())


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


def systemd_context(plan: ResolvedPlan, plan_path: Path, executable: str | None, root: Path | None) -> dict:
    """The plan's environment, and Power's own command line with `power` as an absolute path (systemd runs no
    shell and, before v239, resolves no PATH)."""
    executable = executable or power_executable()
    if executable is None or not Path(executable).is_absolute():
        raise RenderError(code="PWR462", message=f"the systemd unit needs the absolute path of the power executable, "
                          f"and {'none was found' if executable is None else repr(executable) + ' is not one'}",
                          hint="pass --power-executable /path/to/power (e.g. `command -v power`)")
    argv = engine_launch(plan, "power", plan_path, root=root).argv
    return {**env_context(plan, plan_path), "exec_start": [executable, *argv[1:]]}


def env_context(plan: ResolvedPlan, plan_path: Path) -> dict:
    spec = plan.speculation
    variables = {
        "POWER_PLAN": str(plan_path),
        "POWER_PLAN_DIGEST": plan.digest,
        "POWER_NAME": plan.name,
        "POWER_TARGET": plan.target.path,
        "POWER_TARGET_SHA256": plan.target.sha256,
        "POWER_SPEC_MODE": plan.mode.resolved,
        "POWER_SPEC_CHAIN": ",".join(plan.mode.chain),
        "POWER_SPEC_DRAFT_MAX": spec.k,
        "POWER_SPEC_RECURRENT_SNAPSHOTS": spec.s,
        "POWER_SPEC_ROLLBACK": spec.rollback,
        "POWER_CTX": plan.runtime.ctx,
        "POWER_VERIFY_CAPACITY": plan.runtime.verify_capacity,
        "POWER_ARITHMETIC": plan.runtime.arithmetic,
    }
    return {"variables": variables}
