"""What `power import` does with every option of the pinned llama-server: carried, refused, or of no effect on the plan.

One row per option of the pinned binary's table (`flags`, generated from
`llama-server --help`), named by its long spelling, the way llama.cpp's
`common/arg.cpp` keeps an option's spellings, env name and meaning in one entry.
A test walks the whole option table and finds each option here exactly once, so
an option a new llama.cpp adds cannot be dropped without a decision: carried,
refused with its fix, or of no effect (`power.orchestrator.inputs.launch_lines.options`); a
carried option is read into the field the settings table
(`settings.field_of_option`) names for it.
"""

from __future__ import annotations

from functools import cache

from power.orchestrator.inputs.launch_lines.options import FETCH, WARN, Row, carried, no_effect, refused

_EXITS = "llama-server prints and exits without serving"
_CPU = "CPU threads, affinity, priority or polling: how fast the CPU work runs, not what is loaded or returned"
_REQUEST_DEFAULT = ("a sampling default for requests that do not set it; Power renders plain temperature sampling "
                    "(top-k 0, top-p 1, min-p 0), so a request that relies on this default samples differently")
_SET_PER_REQUEST = "send it in the requests that need it, or drop it"
_CHANGES_MODEL = (
    "changes what the model computes: its outputs are no longer the GGUF's, which the plan checks and records"
)
_FETCH = ("a model to download at start: Power records local files only (size and sha256 checked before anything "
          "runs)")
_FETCH_FIX = ("fetch it first: `hf download REPO FILE`, or declare it in a manifest with "
              "source = {{ repo = \"REPO\", filename = \"FILE\" }} and run `power pull --pin` (llama.cpp picks the "
              "file by the :QUANT tag online, so the file must be named); then pass the local file with {flag} PATH")
_ROPE = "changes the rotary position arithmetic from what the GGUF header declares: " + _CHANGES_MODEL
_ROPE_FIX = "drop it, or write the scaling into the GGUF header (gguf_set_metadata.py) and import that file"
_NGRAM_OTHER = ("a parameter of an n-gram variant Power runs as ngram-mod's lookup (match, shortest and longest "
                "draft): this one has no counterpart")
_NGRAM_FIX = (
    "use --spec-type ngram-mod with --spec-ngram-mod-n-match, --spec-ngram-mod-n-min and --spec-ngram-mod-n-max"
)
_DRAFTER_PLACEMENT = (
    "place the drafter with --spec-draft-device DEV and --spec-draft-ngl N, which Power sizes per device"
)
_PRESET = "a preset: it sets a model to download and a bundle of options Power cannot see on the line"

ROWS: tuple[Row, ...] = (
    # --- the process ---------------------------------------------------------------------------------------------
    refused("--help", _EXITS, "drop it"),
    refused("--version", _EXITS, "drop it"),
    refused("--cache-list", _EXITS, "drop it"),
    refused("--completion-bash", _EXITS, "drop it"),
    refused("--list-devices", _EXITS, "drop it"),
    no_effect("--threads", _CPU),
    no_effect("--threads-batch", _CPU),
    no_effect("--cpu-mask", _CPU),
    no_effect("--cpu-range", _CPU),
    no_effect("--cpu-strict", _CPU),
    no_effect("--prio", _CPU),
    no_effect("--poll", _CPU),
    no_effect("--cpu-mask-batch", _CPU),
    no_effect("--cpu-range-batch", _CPU),
    no_effect("--cpu-strict-batch", _CPU),
    no_effect("--prio-batch", _CPU),
    no_effect("--poll-batch", _CPU),
    no_effect("--numa", "NUMA memory policy on the host: " + _CPU),
    no_effect("--perf", "prints timing counters"),
    no_effect("--escape", "escape sequences in prompts given on the command line (the CLI's, not the server's)"),
    # --- context, batches, KV cache ----------------------------------------------------------------------------
    carried("--ctx-size", "the whole context in tokens (0: the model's trained context): runtime.ctx"),
    carried("--batch-size", "the logical batch: runtime.batch"),
    carried("--ubatch-size", "the micro-batch the compute buffer is sized for: runtime.ubatch"),
    carried("--parallel", "parallel slots (-1: auto, 4 slots over one unified cache): runtime.slots"),
    carried("--kv-unified", "one KV cache shared by every slot: runtime.kv_unified"),
    carried("--flash-attn", "flash attention: runtime.flash_attn"),
    carried("--cache-type-k", "the target's K cache type: runtime.kv_cache_type"),
    carried(
        "--cache-type-v",
        "the target's V cache type: runtime.kv_cache_type (Power keeps one "
        "type for K and V; a different -ctv is refused, PWR445)",
    ),
    no_effect("--predict", "the most tokens a request generates when it sets none: a request limit"),
    no_effect("--keep", "tokens kept when the context shifts: a request-time policy"),
    refused(
        "--swa-full",
        "keeps every position in the sliding-window layers' cache; Power sizes that cache at the window",
        "drop it (the plan sizes the window llama-server keeps without it)",
        accepts=("off",),
    ),
    no_effect("--defrag-thold", "deprecated in llama.cpp: it does nothing"),
    refused(
        "--kv-unified-per-slot",
        "sizes each slot's share of a unified KV cache, which Power's sizing does not model",
        "drop it; size the slots with -np and -c",
    ),
    no_effect("--ctx-checkpoints", "context checkpoints kept in host memory for prompt reuse: not device memory"),
    no_effect("--checkpoint-min-step", "spacing of the host-memory context checkpoints"),
    no_effect("--cache-ram", "the host-memory prompt cache (MiB): not device memory"),
    no_effect("--cache-idle-slots", "idle slots' prompts kept in the host-memory prompt cache"),
    no_effect("--context-shift", "what a request does when it reaches the end of the context"),
    refused(
        "--kv-offload",
        "keeps the KV cache in host memory; Power sizes it on the devices the layers run on",
        "drop it (the KV cache then sits with its layers, as the plan sizes it)",
        accepts=("on",),
    ),
    refused(
        "--repack",
        "turns off the CPU repacked copies of the weights, which Power's CPU sizing counts",
        "drop it (the plan counts the repacked copies llama-server makes by default)",
        accepts=("on",),
    ),
    no_effect("--no-host", "bypasses the pinned host staging buffers: not device memory"),
    no_effect("--load-mode", "how the file is read into memory (mmap, direct I/O): the same bytes end up loaded"),
    no_effect("--lazy-mode", "when the weights are read from the file: the same bytes end up loaded"),
    no_effect("--check-tensors", "validates tensor data at load"),
    no_effect("--op-offload", "whether host-resident weights' operations run on the GPU: speed, not memory"),
    no_effect("--warmup", "an empty run at start"),
    # --- devices, offload, split --------------------------------------------------------------------------------
    carried("--gpu-layers", "the target's layers offloaded to the devices (auto, all or a count): runtime.gpu_layers"),
    carried(
        "--split-mode",
        "how the layers spread over several devices (layer or none; row and tensor are refused): runtime.split_mode",
    ),
    carried("--tensor-split", "each device's share of the layers: runtime.tensor_split"),
    carried("--main-gpu", "with -sm none, the device that runs the model: runtime.main_gpu"),
    refused(
        "--device",
        "the devices the target may use; Power chooses the deployment's devices itself and renders "
        "them as CUDA_VISIBLE_DEVICES",
        "drop it and choose the devices with `power plan --device-index` or the fleet deployment's `devices`",
    ),
    refused(
        "--rpc",
        "runs layers on remote RPC servers, which no plan sizes",
        "drop it and plan the remote machine's devices as a host of their own",
    ),
    refused(
        "--override-tensor",
        "places tensors by name pattern on buffer types; Power sizes by layer and device",
        "drop it and offload with -ngl / -ts / -sm, which the plan sizes per device",
    ),
    refused(
        "--cpu-moe",
        "keeps every MoE expert in host memory; Power does not size experts apart",
        "drop it and offload with -ngl / -ts",
    ),
    refused(
        "--n-cpu-moe",
        "keeps the first N layers' MoE experts in host memory; Power does not size experts apart",
        "drop it and offload with -ngl / -ts",
        accepts=("0",),
    ),
    refused(
        "--n-cpu-ffn",
        "keeps the first N layers' feed-forward weights in host memory; Power sizes by whole layer",
        "drop it and offload with -ngl / -ts",
        accepts=("0",),
    ),
    no_effect(
        "--fit",
        "llama-server resizes unset settings to the free memory it finds at start; Power renders "
        "--fit off and sizes the plan itself, so what runs is what the plan says",
    ),
    no_effect("--fit-target", "the free memory --fit aims to leave per device (Power renders --fit off)"),
    no_effect("--fit-ctx", "the smallest context --fit may choose (Power renders --fit off)"),
    # --- the model and what changes it -----------------------------------------------------------------------------
    carried("--model", "the target GGUF: the manifest's target (size and sha256)"),
    refused("--model-url", _FETCH, _FETCH_FIX.format(flag="-m"), code=FETCH),
    refused("--docker-repo", _FETCH, _FETCH_FIX.format(flag="-m"), code=FETCH),
    refused("--hf-repo", _FETCH, _FETCH_FIX.format(flag="-m"), code=FETCH),
    refused("--hf-file", _FETCH, _FETCH_FIX.format(flag="-m"), code=FETCH),
    no_effect("--hf-token", "the token for downloads (which are refused: -hf, -hfd)"),
    no_effect("--offline", "forbids downloads (which are refused: -hf, -hfd)"),
    refused(
        "--override-kv",
        "overrides GGUF header values at load: " + _CHANGES_MODEL,
        "write the values into the GGUF (gguf_set_metadata.py) and import that file",
    ),
    refused(
        "--lora",
        "loads a LoRA adapter: " + _CHANGES_MODEL,
        "merge the adapter into the GGUF (llama-export-lora) and import the merged file",
    ),
    refused(
        "--lora-scaled",
        "loads scaled LoRA adapters: " + _CHANGES_MODEL,
        "merge the adapters into the GGUF (llama-export-lora) and import that file",
    ),
    no_effect(
        "--lora-init-without-apply",
        "loads adapters without applying them (the adapters themselves are refused: --lora)",
    ),
    refused("--control-vector", "adds a control vector to the hidden states: " + _CHANGES_MODEL, "drop it"),
    refused("--control-vector-scaled", "adds scaled control vectors: " + _CHANGES_MODEL, "drop it"),
    refused("--control-vector-layer-range", "the layers control vectors apply to: " + _CHANGES_MODEL, "drop it"),
    refused("--rope-scaling", _ROPE, _ROPE_FIX),
    refused("--rope-scale", _ROPE, _ROPE_FIX),
    refused("--rope-freq-base", _ROPE, _ROPE_FIX),
    refused("--rope-freq-scale", _ROPE, _ROPE_FIX),
    refused("--yarn-orig-ctx", _ROPE, _ROPE_FIX, accepts=("0",)),
    refused("--yarn-ext-factor", _ROPE, _ROPE_FIX, accepts=("-1",)),
    refused("--yarn-attn-factor", _ROPE, _ROPE_FIX, accepts=("-1",)),
    refused("--yarn-beta-slow", _ROPE, _ROPE_FIX, accepts=("-1",)),
    refused("--yarn-beta-fast", _ROPE, _ROPE_FIX, accepts=("-1",)),
    refused(
        "--mmproj",
        "loads a multimodal projector, whose weights no plan sizes",
        "serve images from a deployment planned for them; drop it here",
    ),
    refused("--mmproj-url", "downloads a multimodal projector, whose weights no plan sizes", "drop it"),
    no_effect("--mmproj-auto", "loads the projector an -hf repository ships (downloads are refused)"),
    no_effect("--mmproj-offload", "where a projector runs (projectors are refused: --mmproj)"),
    no_effect("--mmproj-device", "the projector's device (projectors are refused: --mmproj)"),
    no_effect("--image-min-tokens", "image inputs (projectors are refused: --mmproj)"),
    no_effect("--image-max-tokens", "image inputs (projectors are refused: --mmproj)"),
    no_effect("--mtmd-batch-max-tokens", "multimodal inputs (projectors are refused: --mmproj)"),
    no_effect("--video-fps", "video inputs (projectors are refused: --mmproj)"),
    no_effect("--video-timestamp-interval", "video inputs (projectors are refused: --mmproj)"),
    no_effect("--video-ffmpeg-dir", "video inputs (projectors are refused: --mmproj)"),
    refused(
        "--embedding",
        "serves embeddings only: the deployment generates nothing a speculative plan could speed up",
        "drop it, or serve embeddings from a deployment of their own",
    ),
    refused(
        "--rerank",
        "serves reranking only: the deployment generates nothing a speculative plan could speed up",
        "drop it, or serve reranking from a deployment of their own",
    ),
    no_effect("--pooling", "how embeddings are pooled (embeddings are refused: --embedding)"),
    no_effect("--embd-normalize", "how embeddings are normalised (embeddings are refused: --embedding)"),
    refused(
        "--models-dir",
        "router mode: the server loads models from a folder on demand, none of which a plan names",
        "import one launch per model with -m PATH",
    ),
    refused(
        "--models-preset",
        "router mode: the server loads models from a preset file, none of which a plan names",
        "import one launch per model with -m PATH",
    ),
    no_effect("--models-max", "router mode's loaded-model limit (router mode is refused: --models-dir)"),
    no_effect("--models-autoload", "router mode's loading policy (router mode is refused: --models-dir)"),
    # --- speculation ---------------------------------------------------------------------------------------------
    carried("--spec-type", "the speculative types, in order: spec_mode and the manifest's drafters"),
    carried(
        "--spec-draft-model", "the drafter GGUF: the manifest's drafter (size, sha256, bound to the target's digest)"
    ),
    refused("--spec-draft-hf", _FETCH, _FETCH_FIX.format(flag="--spec-draft-model"), code=FETCH),
    carried("--spec-draft-n-max", "K, the longest draft: spec_draft_max (and S = K)"),
    refused(
        "--spec-draft-n-min",
        "the shortest draft a drafter proposes; Power's drafters propose up to K with no minimum",
        "drop it",
        accepts=("0",),
    ),
    carried("--spec-draft-p-min", "the confidence a drafted position needs: spec_draft_p_min"),
    refused(
        "--spec-draft-p-split",
        "the probability at which draft-simple splits into a second sequence; Power's drafters draft one sequence",
        "drop it",
        accepts=("0.10",),
    ),
    refused(
        "--spec-synth-len",
        "synthetic drafts of a fixed length (a test harness): the server then verifies drafts no drafter proposed",
        "drop it",
    ),
    refused(
        "--spec-synth-rates",
        "synthetic acceptance rates (a test harness): the server then verifies drafts no drafter proposed",
        "drop it",
    ),
    carried("--spec-draft-type-k", "the drafter's K cache type: runtime.draft_kv_cache_type"),
    carried(
        "--spec-draft-type-v",
        "the drafter's V cache type: runtime.draft_kv_cache_type "
        "(one type for K and V; a different one is refused, "
        "PWR445)",
    ),
    carried(
        "--spec-draft-device",
        "the device the drafter runs on: runtime.draft_device (the deployment's device, counted from 0)",
    ),
    carried("--spec-draft-ngl", "the drafter's layers offloaded to its device: runtime.draft_gpu_layers"),
    carried(
        "--spec-draft-override-tensor",
        "drafter tensors placed by name pattern in host memory (CPU) or on a GPU "
        "(CUDA<n>): runtime.draft_override_tensor",
    ),
    refused(
        "--spec-draft-cpu-moe",
        "keeps the drafter's MoE experts in host memory; Power does not size experts apart",
        "drop it and " + _DRAFTER_PLACEMENT,
    ),
    refused(
        "--spec-draft-n-cpu-moe",
        "keeps the drafter's first N layers' experts in host memory; Power does not size experts apart",
        "drop it and " + _DRAFTER_PLACEMENT,
        accepts=("0",),
    ),
    no_effect("--spec-draft-backend-sampling", "where the drafter's sampling runs (device or CPU): the same tokens"),
    no_effect("--spec-draft-threads", _CPU),
    no_effect("--spec-draft-threads-batch", _CPU),
    no_effect("--spec-draft-cpu-mask", _CPU),
    no_effect("--spec-draft-cpu-range", _CPU),
    no_effect("--spec-draft-cpu-strict", _CPU),
    no_effect("--spec-draft-prio", _CPU),
    no_effect("--spec-draft-poll", _CPU),
    no_effect("--spec-draft-cpu-mask-batch", _CPU),
    no_effect("--spec-draft-cpu-strict-batch", _CPU),
    no_effect("--spec-draft-prio-batch", _CPU),
    no_effect("--spec-draft-poll-batch", _CPU),
    carried("--spec-ngram-mod-n-match", "tokens the n-gram lookup matches: runtime.ngram_match"),
    carried("--spec-ngram-mod-n-min", "the shortest n-gram draft kept: runtime.ngram_draft_min"),
    carried("--spec-ngram-mod-n-max", "the longest n-gram draft: runtime.ngram_draft_max"),
    refused("--spec-ngram-simple-size-n", _NGRAM_OTHER, _NGRAM_FIX),
    refused("--spec-ngram-simple-size-m", _NGRAM_OTHER, _NGRAM_FIX),
    refused("--spec-ngram-simple-min-hits", _NGRAM_OTHER, _NGRAM_FIX),
    refused("--spec-ngram-map-k-size-n", _NGRAM_OTHER, _NGRAM_FIX),
    refused("--spec-ngram-map-k-size-m", _NGRAM_OTHER, _NGRAM_FIX),
    refused("--spec-ngram-map-k-min-hits", _NGRAM_OTHER, _NGRAM_FIX),
    refused("--spec-ngram-map-k4v-size-n", _NGRAM_OTHER, _NGRAM_FIX),
    refused("--spec-ngram-map-k4v-size-m", _NGRAM_OTHER, _NGRAM_FIX),
    refused("--spec-ngram-map-k4v-min-hits", _NGRAM_OTHER, _NGRAM_FIX),
    refused("--lookup-cache-static", "a lookup cache file for ngram-cache: " + _NGRAM_OTHER, _NGRAM_FIX),
    refused("--lookup-cache-dynamic", "a lookup cache file for ngram-cache: " + _NGRAM_OTHER, _NGRAM_FIX),
    refused("--spec-default", _PRESET, "write the options it stands for (`llama-server --help`) on the line"),
    # removed options: llama-server stops at start (PWR454 quotes its error)
    refused("--draft", "removed: llama-server stops at start (PWR454)", "use --spec-draft-n-max"),
    refused("--draft-min", "removed: llama-server stops at start (PWR454)", "drop it"),
    refused("--spec-ngram-size-n", "removed: llama-server stops at start (PWR454)", "use --spec-ngram-mod-n-match"),
    refused("--spec-ngram-size-m", "removed: llama-server stops at start (PWR454)", "use --spec-ngram-mod-n-max"),
    refused("--spec-ngram-min-hits", "removed: llama-server stops at start (PWR454)", "drop it"),
    # --- sampling ---------------------------------------------------------------------------------------------------
    carried("--seed", "the sampling seed: sampling.seed"),
    carried("--temp", "the default temperature: sampling.temperature"),
    refused("--top-k", _REQUEST_DEFAULT, _SET_PER_REQUEST, code=WARN, accepts=("0",)),
    refused("--top-p", _REQUEST_DEFAULT, _SET_PER_REQUEST, code=WARN, accepts=("1",)),
    refused("--min-p", _REQUEST_DEFAULT, _SET_PER_REQUEST, code=WARN, accepts=("0",)),
    refused("--top-nsigma", _REQUEST_DEFAULT, _SET_PER_REQUEST, code=WARN, accepts=("-1",)),
    refused("--xtc-probability", _REQUEST_DEFAULT, _SET_PER_REQUEST, code=WARN, accepts=("0",)),
    refused("--xtc-threshold", _REQUEST_DEFAULT, _SET_PER_REQUEST, code=WARN, accepts=("0.1",)),
    refused("--typical", _REQUEST_DEFAULT, _SET_PER_REQUEST, code=WARN, accepts=("1",)),
    refused("--repeat-last-n", _REQUEST_DEFAULT, _SET_PER_REQUEST, code=WARN, accepts=("64",)),
    refused(
        "--repeat-penalty",
        _REQUEST_DEFAULT + " (a penalty changes greedy output too)",
        _SET_PER_REQUEST,
        code=WARN,
        accepts=("1",),
    ),
    refused(
        "--presence-penalty",
        _REQUEST_DEFAULT + " (a penalty changes greedy output too)",
        _SET_PER_REQUEST,
        code=WARN,
        accepts=("0",),
    ),
    refused(
        "--frequency-penalty",
        _REQUEST_DEFAULT + " (a penalty changes greedy output too)",
        _SET_PER_REQUEST,
        code=WARN,
        accepts=("0",),
    ),
    refused("--dry-multiplier", _REQUEST_DEFAULT, _SET_PER_REQUEST, code=WARN, accepts=("0",)),
    refused("--dry-base", _REQUEST_DEFAULT, _SET_PER_REQUEST, code=WARN, accepts=("1.75",)),
    refused("--dry-allowed-length", _REQUEST_DEFAULT, _SET_PER_REQUEST, code=WARN, accepts=("2",)),
    refused("--dry-penalty-last-n", _REQUEST_DEFAULT, _SET_PER_REQUEST, code=WARN, accepts=("64",)),
    refused("--dry-sequence-breaker", _REQUEST_DEFAULT, _SET_PER_REQUEST, code=WARN),
    refused("--adaptive-target", _REQUEST_DEFAULT, _SET_PER_REQUEST, code=WARN, accepts=("-1",)),
    refused("--adaptive-decay", _REQUEST_DEFAULT, _SET_PER_REQUEST, code=WARN, accepts=("0.9",)),
    refused("--dynatemp-range", _REQUEST_DEFAULT, _SET_PER_REQUEST, code=WARN, accepts=("0",)),
    refused("--dynatemp-exp", _REQUEST_DEFAULT, _SET_PER_REQUEST, code=WARN, accepts=("1",)),
    refused("--mirostat", _REQUEST_DEFAULT, _SET_PER_REQUEST, code=WARN, accepts=("0",)),
    refused("--mirostat-lr", _REQUEST_DEFAULT, _SET_PER_REQUEST, code=WARN, accepts=("0.1",)),
    refused("--mirostat-ent", _REQUEST_DEFAULT, _SET_PER_REQUEST, code=WARN, accepts=("5",)),
    refused("--samplers", _REQUEST_DEFAULT, _SET_PER_REQUEST, code=WARN),
    refused("--sampler-seq", _REQUEST_DEFAULT, _SET_PER_REQUEST, code=WARN),
    refused("--logit-bias", _REQUEST_DEFAULT + " (a bias changes greedy output too)", _SET_PER_REQUEST, code=WARN),
    refused("--ignore-eos", _REQUEST_DEFAULT + " (generation runs past end of sequence)", _SET_PER_REQUEST, code=WARN),
    refused("--grammar", _REQUEST_DEFAULT + " (a grammar constrains greedy output too)", _SET_PER_REQUEST, code=WARN),
    refused(
        "--grammar-file", _REQUEST_DEFAULT + " (a grammar constrains greedy output too)", _SET_PER_REQUEST, code=WARN
    ),
    refused(
        "--json-schema", _REQUEST_DEFAULT + " (a schema constrains greedy output too)", _SET_PER_REQUEST, code=WARN
    ),
    refused(
        "--json-schema-file", _REQUEST_DEFAULT + " (a schema constrains greedy output too)", _SET_PER_REQUEST, code=WARN
    ),
    no_effect("--backend-sampling", "where sampling runs (device or CPU): the same tokens"),
    no_effect("--reverse-prompt", "the CLI's interactive stop word; the server reads stop words from each request"),
    no_effect("--special", "whether special tokens are printed as text"),
    no_effect("--spm-infill", "the infill prompt's order (the /infill route), not generation"),
    no_effect("--slot-prompt-similarity", "how a request picks a slot whose cached prompt it shares"),
    # --- chat formatting: what a chat request's prompt becomes --------------------------------------------------------
    refused(
        "--chat-template",
        "the chat template chat requests are formatted with; Power's render writes none, so "
        "the model's own template applies",
        "drop it and put the template in the GGUF header "
        "(tokenizer.chat_template), or set it on the rendered command yourself",
        code=WARN,
    ),
    refused(
        "--chat-template-file",
        "the chat template chat requests are formatted with; Power's render writes none, "
        "so the model's own template applies",
        "drop it and put the template in the GGUF header (tokenizer.chat_template)",
        code=WARN,
    ),
    refused(
        "--chat-template-kwargs",
        "values passed to the chat template; Power's render writes none",
        "send them per request (chat_template_kwargs)",
        code=WARN,
    ),
    no_effect("--jinja", "the Jinja template engine (on by default): how the template is run, not which"),
    refused(
        "--reasoning-format",
        "how reasoning text is returned; Power's render writes none",
        "send it per request, or drop it",
        code=WARN,
        accepts=("auto",),
    ),
    refused(
        "--reasoning",
        "turns the template's reasoning on or off; Power's render writes none",
        "send it per request, or drop it",
        code=WARN,
        accepts=("auto",),
    ),
    refused(
        "--reasoning-effort",
        "the template's reasoning effort; Power's render writes none",
        "send it per request, or drop it",
        code=WARN,
        accepts=("default",),
    ),
    refused(
        "--reasoning-budget", "caps reasoning tokens; Power's render writes none", "drop it", code=WARN, accepts=("-1",)
    ),
    no_effect(
        "--reasoning-budget-message",
        "the text added when the reasoning budget runs out (the budget itself is refused: --reasoning-budget)",
    ),
    no_effect("--reasoning-preserve", "whether earlier turns' reasoning stays in the prompt's history"),
    no_effect("--skip-chat-parsing", "whether tool calls and reasoning are parsed out of the output text"),
    no_effect("--prefill-assistant", "whether a trailing assistant message is continued rather than closed"),
    # --- the HTTP server ---------------------------------------------------------------------------------------------
    no_effect("--host", "the listen address: the render's --listen"),
    no_effect("--port", "the listen port: the render's --listen"),
    no_effect("--reuse-port", "several processes sharing the port"),
    no_effect("--path", "static files served beside the API"),
    no_effect("--api-prefix", "a prefix for every route"),
    no_effect(
        "--alias",
        "the name /v1/models reports; llama-server answers any model name a request sends, and "
        "Power renders the plan's name",
    ),
    no_effect("--tags", "labels /v1/models reports"),
    refused(
        "--api-key",
        "the key clients must send; the render takes a key file instead (the key never on a command line)",
        "render with `power render --api-key-file FILE` (or the fleet's api_key_secret)",
        code=WARN,
    ),
    refused(
        "--api-key-file",
        "the file of keys clients must send; the render takes it as an option",
        "render with `power render --api-key-file FILE` (or the fleet's api_key_secret)",
        code=WARN,
    ),
    refused(
        "--ssl-key-file",
        "TLS on the server itself; Power's render serves plain HTTP",
        "terminate TLS in front of the rendered server (a proxy or the Kubernetes ingress)",
        code=WARN,
    ),
    refused(
        "--ssl-cert-file",
        "TLS on the server itself; Power's render serves plain HTTP",
        "terminate TLS in front of the rendered server (a proxy or the Kubernetes ingress)",
        code=WARN,
    ),
    no_effect("--cors-origins", "CORS headers"),
    no_effect("--cors-methods", "CORS headers"),
    no_effect("--cors-headers", "CORS headers"),
    no_effect("--cors-credentials", "CORS headers"),
    no_effect("--ui", "the bundled web UI"),
    no_effect("--ui-config", "the bundled web UI"),
    no_effect("--ui-config-file", "the bundled web UI"),
    no_effect("--ui-mcp-proxy", "the bundled web UI's MCP proxy"),
    no_effect("--tools", "tools the web UI's agent may call"),
    no_effect("--tools-runtime", "where the web UI's tools run"),
    no_effect("--mcp-servers-config", "MCP servers for the web UI's agent"),
    no_effect("--mcp-servers-json", "MCP servers for the web UI's agent"),
    no_effect("--agent", "the web UI's agent"),
    no_effect("--timeout", "the HTTP read/write timeout"),
    no_effect("--sse-ping-interval", "keep-alive pings on streamed responses"),
    no_effect("--threads-http", "HTTP worker threads"),
    no_effect("--cache-prompt", "reuse of a slot's cached prompt (the same tokens, less prefill)"),
    no_effect("--cache-reuse", "reuse of cached prompt chunks by shifting them (the same tokens, less prefill)"),
    no_effect("--cont-batching", "continuous batching: when requests join a batch, not what they return"),
    no_effect("--metrics", "the /metrics route (Power renders it on)"),
    no_effect("--props", "the POST /props route"),
    no_effect("--slots", "the /slots route"),
    no_effect("--slot-save-path", "where slot caches are saved on request"),
    no_effect("--media-path", "local media files requests may name"),
    no_effect("--sleep-idle-seconds", "unloads the model after idle seconds and reloads it on the next request"),
    no_effect("--log-prompts-dir", "writes prompts to a folder"),
    # --- logging ------------------------------------------------------------------------------------------------------
    no_effect("--log-disable", "logging"),
    no_effect("--log-file", "logging"),
    no_effect("--log-jsonl", "logging"),
    no_effect("--log-colors", "logging"),
    no_effect("--verbose", "logging"),
    no_effect("--verbosity", "logging"),
    no_effect("--log-prefix", "logging"),
    no_effect("--log-timestamps", "logging"),
    # --- presets: a model to download and options Power cannot see ----------------------------------------------------
    *(
        refused(preset, _PRESET, "write the options it stands for (`llama-server --help`) and -m PATH on the line")
        for preset in (
            "--embd-gemma-default",
            "--fim-qwen-1.5b-default",
            "--fim-qwen-3b-default",
            "--fim-qwen-7b-default",
            "--fim-qwen-7b-spec",
            "--fim-qwen-14b-spec",
            "--fim-qwen-30b-default",
            "--gpt-oss-20b-default",
            "--gpt-oss-120b-default",
            "--vision-gemma-4b-default",
            "--vision-gemma-12b-default",
        )
    ),
)


@cache
def by_option() -> dict[str, Row]:
    """The rows by option name (the test holds each option to exactly one row)."""
    return {row.option: row for row in ROWS}


def row(option: str) -> Row:
    """The row of the option named `option` (its long spelling); KeyError is a Power bug the table test catches."""
    return by_option()[option]
