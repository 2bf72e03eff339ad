"""Launch artifacts from a resolved plan: llama-server, vLLM, the Power runtime, an env file, a systemd drop-in.

The templates under `templates/` lay the artifacts out; this module decides what
goes in them. `engine_launch` is the one source of an engine's command line: the
shell templates print it and the Kubernetes render puts the same words in a
container's command. Every value that reaches a shell line passes through `shlex.quote`
(systemd additionally doubles `%` and `$`, which it expands itself); every value
that reaches a comment has its line breaks escaped. A plan feature an engine has
no flag for (S snapshots, FR, the adaptive controller, the fixed verification
shape) is said in a comment, never invented as a flag; a mode an engine cannot
run at all is refused (RenderError), never downgraded.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

import jinja2

from power import modes
from power.findings import PowerError
from power.orchestrator.plan import ResolvedPlan

TARGETS = ("llama-server", "vllm", "power", "env", "systemd")
ENGINES = ("power", "llama-server", "vllm")

# vLLM's --kv-cache-dtype has no llama.cpp block types: f16/bf16 map to the model dtype.
VLLM_KV_DTYPES = {"f16": "auto", "bf16": "auto", "f32": "auto"}


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
    env.filters["systemd"] = systemd_quote
    env.filters["comment"] = comment_safe
    return env


def systemd_quote(value: object) -> str:
    """A shell-quoted word that systemd's own `%specifier` and `$VAR` expansion leaves alone."""
    return shlex.quote(str(value)).replace("%", "%%").replace("$", "$$")


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


def render(plan: ResolvedPlan, target: str, plan_path: Path) -> str:
    if target not in TARGETS:
        raise RenderError(f"unknown render target {target!r}; choose one of {', '.join(TARGETS)}")
    plan_path = Path(plan_path).resolve()
    if target in ENGINES:
        context = {"launch": engine_launch(plan, target, plan_path)}
    else:
        context = env_context(plan, plan_path)
    template = _environment().get_template(f"{target}.j2")
    return template.render(plan=plan, plan_path=str(plan_path), **context)


def engine_launch(plan: ResolvedPlan, engine: str, plan_path: Path, listen: Listen | None = None) -> Launch:
    """The command line that runs `plan` on `engine` (power | llama-server | vllm); RenderError if it cannot."""
    if engine not in ENGINES:
        raise RenderError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if engine == "power":
        launch = power_launch(plan_path)
    else:
        launch = llama_server_launch(plan) if engine == "llama-server" else vllm_launch(plan)
    if listen is None:
        return launch
    address = (("--host", listen.host), ("--port", str(listen.port)))
    return Launch(launch.program, launch.options + address + _metrics_options(engine), launch.env, launch.notes)


def _metrics_options(engine: str) -> tuple[tuple[str, ...], ...]:
    """llama-server serves /metrics only when asked; vLLM and `power serve` always do."""
    return (("--metrics",),) if engine == "llama-server" else ()


def _options(pairs: list[tuple[str, object]]) -> tuple[tuple[str, ...], ...]:
    return tuple((flag, str(value)) for flag, value in pairs)


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
    rt = plan.runtime
    args: list[tuple[str, object]] = [
        ("-m", plan.target.path),
        ("--alias", plan.name),
        ("-c", rt.ctx),
        ("-ngl", rt.gpu_layers),
        ("-fa", "on" if rt.flash_attn else "off"),
        ("-ctk", rt.kv_cache_type),
        ("-ctv", rt.kv_cache_type),
        ("--seed", plan.sampling.seed),
        ("--temp", plan.sampling.temperature),
    ]
    if chain:
        args.append(("--spec-type", ",".join(str(modes.llama_spec_type(kind)) for kind in chain)))
    drafting = [d for d in plan.drafters if d.kind not in modes.WEIGHT_FREE]
    if drafting:
        args.append(("--spec-draft-n-max", plan.speculation.k))
        args += [("--spec-draft-type-k", rt.draft_kv_cache_type), ("--spec-draft-type-v", rt.draft_kv_cache_type)]
        if rt.draft_device is not None:
            args.append(("--spec-draft-device", rt.draft_device))
    args += [("--spec-draft-model", d.path) for d in drafting if d.path is not None]
    if any(kind in modes.WEIGHT_FREE for kind in chain):
        args += [("--spec-ngram-mod-n-min", rt.ngram_n_min), ("--spec-ngram-mod-n-max", rt.ngram_n_max)]
    notes = unsupported_notes(plan) if chain else []
    env = {"GGML_CUDA_DISABLE_GRAPHS": "1"} if not rt.cuda_graphs else {}
    return Launch(("llama-server",), _options(args), env, tuple(notes))


def vllm_launch(plan: ResolvedPlan) -> Launch:
    chain = plan.mode.chain
    if len(chain) > 1:
        raise RenderError(f"vLLM runs one speculative method; this plan chains {' + '.join(chain)}: "
                          "render with --target llama-server or --target power")
    if chain and modes.vllm_method(chain[0]) is None:
        raise RenderError(f"vLLM has no {chain[0]} speculative method; render this plan with --target power")
    rt = plan.runtime
    args: list[tuple[str, object]] = [("--served-model-name", plan.name), ("--max-model-len", rt.ctx),
                                      ("--seed", plan.sampling.seed)]
    notes = []
    if rt.kv_cache_type in VLLM_KV_DTYPES:
        args.append(("--kv-cache-dtype", VLLM_KV_DTYPES[rt.kv_cache_type]))
    else:
        notes.append(f"kv cache type {rt.kv_cache_type}: vLLM has no such --kv-cache-dtype; it uses the model dtype")
    if chain:
        args.append(("--speculative-config", json.dumps(speculative_config(plan), sort_keys=True)))
        notes += unsupported_notes(plan)
    flags = (("--enforce-eager",),) if not rt.cuda_graphs else ()
    return Launch(("vllm", "serve", plan.target.path), flags + _options(args), {}, tuple(notes))


def speculative_config(plan: ResolvedPlan) -> dict:
    kind = plan.mode.chain[0]
    config: dict[str, object] = {"method": modes.vllm_method(kind), "num_speculative_tokens": plan.speculation.k}
    drafter = next(d for d in plan.drafters if d.kind == kind)
    if drafter.path is not None:
        config["model"] = drafter.path
    if kind in modes.WEIGHT_FREE:
        config |= {"prompt_lookup_min": plan.runtime.ngram_n_min, "prompt_lookup_max": plan.runtime.ngram_n_max}
    return config


def power_launch(plan_path: Path) -> Launch:
    return Launch(("power", "serve", str(plan_path)), (), {}, ())


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
    }
    for name, value in variables.items():
        if any(ord(ch) < 32 for ch in str(value)):
            raise RenderError(code="PWR461", message=f"{name} ({str(value)!r}) contains a control character, which env files and systemd "
                              "cannot carry; rename it in the manifest and recompile the plan")
    return {"variables": variables}
