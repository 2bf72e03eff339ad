"""Launch artifacts from a resolved plan: llama-server, vLLM, the Power runtime, env files, a systemd drop-in.

The templates under `templates/` lay the artifacts out; this module decides what
goes in them. A rendered engine runs what the plan says: every setting whose
engine default differs from the plan is written (slots, unified KV, batch and
micro-batch, the n-gram's match and draft lengths, the confidence gate, the
sampler chain, listen address, metrics). `llama_server_args` is the one
source of the llama-server command line: the shell script, the env file
(`LLAMA_ARG_*` as llama.cpp's `common/arg.cpp` names them, `power.orchestrator.llama_flags`)
and `power bench --engine llama-server` all take it from there.

Every value that reaches a shell line passes through `shlex.quote` (systemd
additionally doubles `%` and `$`, which it expands itself); every value that
reaches a comment has its line breaks escaped. A plan feature an engine has no
flag for (S snapshots, FR, the adaptive controller, the fixed verification
shape) is said in a comment, never invented as a flag; a mode or artifact an
engine cannot run is refused (RenderError), never downgraded.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

import jinja2

from power import modes
from power.findings import PowerError
from power.orchestrator import llama_flags
from power.orchestrator.plan import ResolvedPlan

TARGETS = ("llama-server", "llama-server-env", "vllm", "power", "env", "systemd")

# vLLM's --kv-cache-dtype has no llama.cpp block types: f16/bf16 map to the model dtype.
VLLM_KV_DTYPES = {"f16": "auto", "bf16": "auto", "f32": "auto"}
# The variable a llama-server env file puts the options without an LLAMA_ARG_* name in (the serve script
# passes it unquoted: `exec llama-server $LLAMA_SERVER_EXTRA_ARGS`).
EXTRA_ARGS = "LLAMA_SERVER_EXTRA_ARGS"


class RenderError(PowerError):
    """The plan asks for something the chosen engine cannot run; the message says which target can."""

    code = "PWR460"


@dataclass(frozen=True)
class Listen:
    """Where the rendered server listens (llama-server's and vLLM's defaults differ: written explicitly)."""

    host: str = "127.0.0.1"
    port: int = 8080


# One option on an engine's command line: the flag, and its value (None for a switch).
Arg = tuple[str, object]


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


def render(plan: ResolvedPlan, target: str, plan_path: Path, listen: Listen = Listen()) -> str:
    if target not in TARGETS:
        raise RenderError(f"unknown render target {target!r}; choose one of {', '.join(TARGETS)}")
    plan_path = Path(plan_path).resolve()
    if target == "llama-server":
        context = llama_server_context(plan, listen)
    elif target == "llama-server-env":
        context = llama_server_env_context(plan, listen)
    elif target == "vllm":
        context = vllm_context(plan, listen)
    elif target == "power":
        context = {"listen": listen}
    else:
        context = env_context(plan, plan_path)
    template = _environment().get_template(f"{target}.j2")
    return template.render(plan=plan, plan_path=str(plan_path), **context)


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


# --- llama-server --------------------------------------------------------------------------------


def llama_server_args(plan: ResolvedPlan, listen: Listen = Listen()) -> list[Arg]:
    """The llama-server command line (without the program) that runs `plan`, every engine default the plan differs
    from written out; RenderError when llama-server cannot run the plan's speculation."""
    chain = plan.mode.chain
    for kind in chain:
        if modes.mode(kind).reserved:
            raise RenderError(f"`{kind}` is reserved and has no production adapter; nothing to render")
        if modes.llama_spec_type(kind) is None:
            raise RenderError(f"llama-server has no {kind} speculative type; render this plan with --target power")
    rt, sampling = plan.runtime, plan.sampling
    args: list[Arg] = [
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
        ("--host", listen.host),
        ("--port", listen.port),
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
    return args


def llama_server_argv(plan: ResolvedPlan, listen: Listen = Listen()) -> list[str]:
    """`llama_server_args` as the argv words after the program name."""
    return [str(word) for flag, value in llama_server_args(plan, listen)
            for word in ((flag,) if value is None else (flag, value))]


def llama_server_context(plan: ResolvedPlan, listen: Listen) -> dict:
    args = llama_server_args(plan, listen)
    notes = unsupported_notes(plan) if plan.mode.chain else []
    return {"args": args, "notes": notes, "disable_cuda_graphs": not plan.runtime.cuda_graphs}


def llama_server_env_context(plan: ResolvedPlan, listen: Listen) -> dict:
    """The same command line as LLAMA_ARG_* variables; options llama.cpp gives no variable go in EXTRA_ARGS."""
    table = llama_flags.table()
    variables: dict[str, object] = {}
    extra: list[str] = []
    for flag, value in llama_server_args(plan, listen):
        option = table.option(flag)
        if option.env is None:
            extra += [flag] if value is None else [flag, str(value)]
        elif value is None:
            variables[option.env] = "false" if llama_flags.negative(flag) else "true"
        else:
            variables[option.env] = value
    unsplittable = [word for word in extra if not word or any(ch.isspace() or ch in "'\"\\$" for ch in word)]
    if unsplittable:
        raise RenderError(code="PWR461", message=f"{EXTRA_ARGS} would carry {unsplittable[0]!r}, which a serve "
                          "script's word splitting cannot pass as one argument", hint="use --target llama-server")
    if extra:
        variables[EXTRA_ARGS] = " ".join(extra)
    _no_control_characters(variables)
    notes = unsupported_notes(plan) if plan.mode.chain else []
    if not plan.runtime.cuda_graphs:
        variables["GGML_CUDA_DISABLE_GRAPHS"] = 1
    return {"variables": variables, "notes": notes, "extra": EXTRA_ARGS}


# --- vLLM ----------------------------------------------------------------------------------------


def vllm_context(plan: ResolvedPlan, listen: Listen) -> dict:
    chain = plan.mode.chain
    if len(chain) > 1:
        raise RenderError(f"vLLM runs one speculative method; this plan chains {' + '.join(chain)}: "
                          "render with --target llama-server or --target power")
    if chain and modes.vllm_method(chain[0]) is None:
        raise RenderError(f"vLLM has no {chain[0]} speculative method; render this plan with --target power")
    if chain and modes.mode(chain[0]).vllm_refusal:
        raise RenderError(code="PWR462", message=str(modes.mode(chain[0]).vllm_refusal),
                          hint="render this plan with --target llama-server or --target power")
    if any(d.path is not None and modes.mode(d.kind).sidecar for d in plan.drafters):
        raise RenderError(code="PWR462", message="vLLM reads an MTP head from the target checkpoint; this plan's "
                          "head is a separate MTP-only GGUF, which vLLM cannot attach",
                          hint="render this plan with --target llama-server or --target power")
    rt = plan.runtime
    args: list[Arg] = [("--served-model-name", plan.name), ("--max-model-len", rt.ctx),
                       ("--max-num-seqs", rt.slots), ("--max-num-batched-tokens", rt.batch),
                       ("--seed", plan.sampling.seed), ("--host", listen.host), ("--port", listen.port),
                       # the model's generation_config.json would override the plan's sampling otherwise
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
    flags = ["--enforce-eager"] if not rt.cuda_graphs else []
    return {"args": args, "flags": flags, "notes": notes}


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


# --- the POWER_* env file (and the systemd drop-in) ------------------------------------------------------------


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
    _no_control_characters(variables)
    return {"variables": variables}


def _no_control_characters(variables: dict[str, object]) -> None:
    for name, value in variables.items():
        if any(ord(ch) < 32 for ch in str(value)):
            raise RenderError(code="PWR461", message=f"{name} ({str(value)!r}) contains a control character, which env "
                              "files and systemd cannot carry; rename it in the manifest and recompile the plan")
