"""What `power import vllm` does with each vLLM argument it reads: carried, refused, or of no effect on the plan.

vLLM has no option table Power pins (its arguments are `vllm/engine/arg_utils.py` `EngineArgs` and the OpenAI
server's `cli_args.py`, hundreds of them, changing each release), so the rows below are the arguments Power reads,
each with its disposition (`power.orchestrator.inputs.launch_lines.options`); any other argument is a warning (PWR446)
naming it, so nothing on the line is dropped without a word. A carried argument's field is the vLLM adapter's settings
table's (`settings.SETTINGS`); the speculative arguments are read by the reader itself (`reader`).
"""

from __future__ import annotations

from functools import cache

from power.orchestrator.inputs.launch_lines.options import REFUSE, WARN, Row, carried, no_effect, refused

# the speculative configuration, read by the reader (`reader.read`), not through the settings table
SPECULATIVE = ("--speculative-config", "--spec-method", "--spec-model", "--spec-tokens")

ROWS: tuple[Row, ...] = (
    carried("--model", "the target GGUF (or the first word after `serve`): the manifest's target"),
    carried("--max-model-len", "the context in tokens: runtime.ctx"),
    carried("--max-num-seqs", "sequences served at once: runtime.slots"),
    carried("--max-num-batched-tokens", "tokens per scheduler step: runtime.batch"),
    carried("--seed", "the sampling seed: sampling.seed"),
    carried("--kv-cache-dtype", "the KV cache type (auto: the model's; fp8 types are refused): runtime.kv_cache_type"),
    carried("--tensor-parallel-size", "each layer sharded over this many devices: runtime.tensor_parallel"),
    carried("--enforce-eager", "no CUDA graphs: runtime.cuda_graphs = false"),
    carried("--speculative-config", "the speculative method, drafter and K: spec_mode, the manifest's drafter, "
                                    "spec_draft_max"),
    carried("--spec-method", "the speculative method: spec_mode"),
    carried("--spec-model", "the drafter: the manifest's drafter"),
    carried("--spec-tokens", "K: spec_draft_max"),
    no_effect("--served-model-name", "the name /v1/models reports; Power renders the plan's name"),
    no_effect("--gpu-memory-utilization", "the share of each device vLLM may take; Power renders the plan's own share "
                                          "(what its sizing charges the busiest device)"),
    no_effect("--host", "the listen address: the render's --listen"),
    no_effect("--port", "the listen port: the render's --listen"),
    no_effect("--trust-remote-code", "whether model code from the Hub may run (a GGUF carries none)"),
    no_effect("--enable-prefix-caching", "reuse of cached prompt blocks (the same tokens, less prefill)"),
    no_effect("--disable-log-requests", "logging"),
    no_effect("--uvicorn-log-level", "logging"),
    refused("--generation-config", "where sampling defaults come from; Power renders `--generation-config vllm` so "
                                   "the model's generation_config.json cannot override the plan's sampling",
            "send sampling settings per request, or drop it", code=WARN, accepts=("vllm",)),
    refused("--api-key", "the key clients must send; the render takes a key file instead (the key never on a command "
                         "line)", "render with `power render --api-key-file FILE` (or the fleet's api_key_secret)",
            code=WARN),
    refused("--tokenizer", "a tokenizer other than the GGUF's own, which Power checks drafter against target",
            "drop it: the GGUF carries its tokenizer"),
    refused("--pipeline-parallel-size", "layers split over devices in stages; Power plans vLLM with tensor "
                                        "parallelism only", "use --tensor-parallel-size", accepts=("1",)),
    refused("--dtype", "the compute dtype; Power sizes the GGUF's own types", "drop it", code=REFUSE,
            accepts=("auto",)),
)


@cache
def by_flag() -> dict[str, Row]:
    return {row.option: row for row in ROWS}
