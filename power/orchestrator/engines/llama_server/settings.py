"""llama-server's settings table: each Power setting with the option it is written as and read back from.

The option's spellings, its env variable and its default come from the pinned
llama.cpp's own option table (`flags`, generated from `llama-server --help`), its
meaning from the importer's row for it (`options`), so one entry holds what
llama.cpp's `common/arg.cpp` keeps in one `common_arg`: the render writes a
setting's flag, the env-file render its variable, the importer reads either back
into the same field through the entry's reader.
"""

from __future__ import annotations

from functools import cache

from power.documents.plan import EngineName
from power.findings import Finding
from power.orchestrator.engines.base import Setting, Settings
from power.orchestrator.engines.llama_server import flags, options
from power.orchestrator.inputs.launch_lines.spec import (
    ValueReader,
    finding,
    is_number,
    read_float,
    read_int,
    read_text,
    read_token,
)
from power.orchestrator.inputs.launch_lines.tokens import Token
from power.orchestrator.inputs.rules import override_target

NAME: EngineName = "llama-server"
ENV_PREFIX = "LLAMA_ARG_"


def _layers(token: Token, findings: list[Finding]) -> int | str | None:
    """-ngl / --spec-draft-ngl: a count, or `auto` / `all` / a negative number: every layer (with --fit off, which
    Power renders, llama.cpp's auto offloads every layer)."""
    if token.text in {"auto", "all"} or (is_number(token.text) and token.text.startswith("-")):
        return "all"
    return read_int(token, findings)


def _flash_attn(token: Token, findings: list[Finding]) -> bool | str | None:
    """-fa on|off|auto as llama.cpp's common/arg.cpp reads it: `auto`, its default, stays auto (see
    power.documents.plan.flash_attention_on), never off."""
    word = token.text.lower()
    if word in {"on", "enabled", "true", "1"}:
        return True
    if word in {"off", "disabled", "false", "0"}:
        return False
    if word in {"auto", "-1"}:
        return "auto"
    findings.append(finding("PWR459", token, f"-fa takes on, off or auto, found {token.text!r}",
                            "write -fa on, -fa off or -fa auto"))
    return None


def _split_mode(token: Token, findings: list[Finding]) -> str | None:
    if token.text in {"layer", "none"}:
        return token.text
    findings.append(finding("PWR444", token, f"-sm {token.text}: Power sizes a layer split (-sm layer) or one device "
                            "(-sm none) only; a row or tensor split shards each layer's matrices, which no plan sizes",
                            "use -sm layer with -ts, or -sm none with -mg"))
    return None


def _ratios(token: Token, findings: list[Finding]) -> list[float] | None:
    """-ts 3,1 (llama.cpp also reads 3/1)."""
    parts = token.text.replace("/", ",").split(",")
    if all(is_number(part) for part in parts):
        return [float(part) for part in parts]
    findings.append(finding("PWR459", token, f"expected ratios such as 3,1, found {token.text!r}",
                            "write one number per device, separated by commas"))
    return None


def _device(token: Token, findings: list[Finding]) -> int | None:
    """--spec-draft-device CUDA1: the position of the drafter's device (the render lists the plan's GPUs as CUDA0,
    CUDA1, ... in order)."""
    name = token.text.strip()
    digits = name.lstrip("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
    if name != digits and digits.isdigit():
        return int(digits)
    findings.append(finding("PWR444", token, f"--spec-draft-device {name}: Power places a drafter on one GPU of the "
                            "deployment, named as llama-server names it (CUDA0, CUDA1, ...)",
                            "name one device, e.g. --spec-draft-device CUDA1; for a drafter on the CPU write "
                            "--spec-draft-ngl 0"))
    return None


def _overrides(token: Token, findings: list[Finding]) -> list[str] | None:
    """--spec-draft-override-tensor PATTERN=BUFFER,...: each entry kept as llama.cpp writes it (split on commas, as
    llama.cpp splits it), each a host (CPU) or a GPU (CUDA<n>) buffer."""
    entries = [entry for entry in token.text.split(",") if entry]
    bad = [entry for entry in entries if override_target(entry) is None]
    if bad:
        findings.append(finding("PWR444", token, f"--spec-draft-override-tensor {bad[0]}: Power sizes a drafter "
                                "tensor placed in host memory (CPU) or on one of the deployment's GPUs (CUDA<n>), by "
                                "a pattern that compiles", "write PATTERN=CPU or PATTERN=CUDA1, e.g. "
                                "'blk\\.1\\.ffn_.*=CPU'"))
        return None
    return entries


# Power's name, the word the render writes (the importer reads every spelling of the same option), and how an
# imported value reads (None: the option is not carried, or is read apart: the `--spec-type` list, a switch).
_ENTRIES: tuple[tuple[str, str, ValueReader | None], ...] = (
    ("model", "-m", read_token), ("alias", "--alias", None), ("ctx", "-c", read_int), ("slots", "-np", read_int),
    ("kv_unified", "--kv-unified", None), ("batch", "-b", read_int), ("ubatch", "-ub", read_int),
    ("gpu_layers", "-ngl", _layers), ("flash_attn", "-fa", _flash_attn), ("fit", "--fit", None),
    ("kv_cache_type", "-ctk", read_text), ("kv_cache_type_v", "-ctv", read_token), ("seed", "--seed", read_int),
    ("temperature", "--temp", read_float), ("top_k", "--top-k", None), ("top_p", "--top-p", None),
    ("min_p", "--min-p", None), ("metrics", "--metrics", None), ("spec_type", "--spec-type", None),
    ("k", "--spec-draft-n-max", read_int), ("draft_kv_cache_type", "--spec-draft-type-k", read_text),
    ("draft_kv_cache_type_v", "--spec-draft-type-v", read_token), ("draft_device", "--spec-draft-device", _device),
    ("draft_gpu_layers", "--spec-draft-ngl", _layers),
    ("draft_override_tensor", "--spec-draft-override-tensor", _overrides), ("p_min", "--spec-draft-p-min", read_float),
    ("draft_model", "--spec-draft-model", read_token), ("ngram_match", "--spec-ngram-mod-n-match", read_int),
    ("ngram_draft_min", "--spec-ngram-mod-n-min", read_int), ("ngram_draft_max", "--spec-ngram-mod-n-max", read_int),
    ("split_mode", "-sm", _split_mode), ("main_gpu", "-mg", read_int), ("tensor_split", "-ts", _ratios),
)


@cache
def settings_table() -> Settings:
    """The settings with each option's env variable, meaning and off spelling as the pinned llama.cpp defines them."""
    table = flags.table()
    return Settings(tuple(_setting(field, table.option(flag), flag, read) for field, flag, read in _ENTRIES))


def _setting(field: str, option: flags.Option, flag: str, read: ValueReader | None) -> Setting:
    off = next((s for s in option.spellings if s.startswith("--") and flags.negative(s)), None)
    return Setting(field, flag, option.env, options.row(option.name).meaning, read, off)


def field_of_option(option: flags.Option) -> str | None:
    """The Power setting a llama-server option sets (any spelling, or its env variable), or None."""
    table = flags.table()
    return next((field for field, flag, _ in _ENTRIES if table.option(flag).name == option.name), None)
