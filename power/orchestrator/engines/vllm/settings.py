"""vLLM's settings table: each Power setting with the argument it is written as (`vllm/engine/arg_utils.py`
`EngineArgs`, the OpenAI server's `cli_args.py`) and how `power import vllm` reads its value back.

vLLM reads its options from the command line only (no variable per option), so an entry has no env name; its
meaning is the importer's row for the argument (`options`).
"""

from __future__ import annotations

from power.documents.plan import EngineName
from power.findings import Finding
from power.orchestrator.engines.base import Setting, Settings
from power.orchestrator.engines.vllm import options
from power.orchestrator.inputs.launch_lines.spec import ValueReader, finding, read_int, read_token
from power.orchestrator.inputs.launch_lines.tokens import Token

NAME: EngineName = "vllm"
# vLLM's --kv-cache-dtype has no llama.cpp block types: f16/bf16 map to the model dtype.
KV_DTYPES = {"f16": "auto", "bf16": "auto", "f32": "auto"}


def _kv_dtype(token: Token, findings: list[Finding]) -> str | None:
    """vLLM's --kv-cache-dtype: `auto` is the model's own type (Power's default); its fp8 types have no counterpart."""
    if token.text == "auto":
        return None
    findings.append(finding("PWR444", token, f"--kv-cache-dtype {token.text}: Power sizes and renders vLLM's KV in "
                            "the model's own type (auto); it has no counterpart for this one", "drop it, or write "
                            "--kv-cache-dtype auto"))
    return None


def _setting(field: str, flag: str, read: ValueReader | None = None) -> Setting:
    row = options.by_flag().get(flag)
    return Setting(field, flag, help=row.meaning if row is not None else "", read=read)


# the speculative configuration and --enforce-eager (a switch) are read apart, by the reader
SETTINGS = Settings((
    _setting("model", "--model", read_token), _setting("alias", "--served-model-name"),
    _setting("ctx", "--max-model-len", read_int), _setting("slots", "--max-num-seqs", read_int),
    _setting("batch", "--max-num-batched-tokens", read_int), _setting("seed", "--seed", read_int),
    _setting("generation_config", "--generation-config"), _setting("kv_cache_type", "--kv-cache-dtype", _kv_dtype),
    _setting("speculative_config", "--speculative-config"),
    _setting("tensor_parallel", "--tensor-parallel-size", read_int),
    _setting("gpu_memory_utilization", "--gpu-memory-utilization"), _setting("tokenizer", "--tokenizer"),
    _setting("eager", "--enforce-eager"),
))
