"""The check catalogue: every stable finding code and what it means.

Codes are like a linter's rules: CI pipelines grep them, so a code is never
renumbered or reused. `docs/checks.md` is generated from this table
(`python -m power.codes > docs/checks.md`; a test keeps it in step).

Families: PWR0xx files and schema; PWR1xx artifacts; PWR2xx drafters;
PWR3xx tokenizer identity; PWR4xx speculation settings and launch lines;
PWR5xx memory; PWR6xx the runtime.
Each family's owner adds its rows in its own section below.
"""

from __future__ import annotations

# code -> (default severity, title)
CODES: dict[str, tuple[str, str]] = {
    # --- PWR0xx: files, TOML, schema ---------------------------------------
    # PWR00x reading the file (orchestrator/inputs/loading.py); PWR001 and PWR009 are usage errors (exit 2)
    "PWR001": ("error", "the path does not exist"),
    "PWR002": ("error", "the path is not a regular file (a FIFO, device, socket or directory)"),
    "PWR003": ("error", "the file is larger than the 8 MiB limit for a TOML file"),
    "PWR004": ("error", "the file is empty"),
    "PWR005": ("error", "the file is binary (it contains NUL bytes), not TOML text"),
    "PWR006": ("error", "the file is not valid UTF-8"),
    "PWR007": ("error", "TOML syntax error"),
    "PWR008": ("error", "TOML arrays or inline tables nested too deeply"),
    "PWR009": ("error", "a directory or glob holds no .toml file"),
    # PWR01x the `schema` line (orchestrator/inputs/loading.py)
    "PWR010": ("error", "the file has no `schema` key"),
    "PWR011": ("error", "the `schema` names an unknown file kind or version"),
    "PWR012": ("error", "the file is of another kind than the one expected here"),
    "PWR013": ("error", "the file cannot be read (permission or I/O error)"),
    "PWR014": ("info", "a document Power generates (plan, fleet lock, evidence): not validated as user input"),
    "PWR015": ("warning", "the `#:schema` first line names another kind's JSON Schema"),
    "PWR016": ("error", "an integer outside TOML's 64-bit range (or of thousands of digits)"),
    "PWR017": ("error", "more findings in one file than are listed (200): their count"),
    "PWR018": ("error", "an output path cannot be written (no such folder, a directory, not writable)"),
    # PWR02x fields (orchestrator/inputs/schema.py, rules.py)
    "PWR020": ("error", "unknown key"),
    "PWR021": ("error", "a required key is missing"),
    "PWR022": ("error", "a value has the wrong type or is out of range"),
    "PWR023": ("error", "a size cannot be read (bad number or unit)"),
    "PWR024": ("error", "a sha256 is not 64 hexadecimal digits"),
    "PWR025": ("error", "a drafter entry lacks the file its kind needs, or names a file its kind cannot use"),
    "PWR026": ("error", "a key spelled the llama.cpp way or renamed: use Power's name for it"),
    # PWR027 `power drafter distill --budget` (drafters/budget.py)
    "PWR027": ("error", "the distillation budget cannot hold writing the drafter out beside what was already spent: "
                        "nothing is trained"),
    # PWR05x engines (orchestrator/engines/, fleet/review.py, app/commands/plan.py)
    "PWR050": ("info", "a deployment names no engine, nor does its profile: it is sized for the "
                       "default (Power's runtime)"),
    # PWR06x fleet files and the fleet lock (orchestrator/fleet/review.py, lock.py)
    "PWR060": ("error", "a deployment names a host the fleet does not define"),
    "PWR061": ("warning", "a path leaves the fleet's directory tree through `..`"),
    "PWR062": ("error", "deployments sharing one device do not fit together"),
    "PWR063": ("error", "the fleet lock was written by a newer schema version"),
    "PWR064": ("error", "the fleet lock was edited by hand (its digest does not match)"),
    "PWR065": ("error", "the fleet lock is unreadable or malformed"),
    "PWR066": ("error", "two deployments share one name on a host"),
    "PWR067": ("error", "a deployment could not be planned"),
    "PWR068": ("error", "the fleet lock changed on disk while this command ran"),
    "PWR069": ("error", "a deployment's engine has no container image (Kubernetes renders)"),
    # PWR07x profile rollout and its evidence gates (orchestrator/fleet/rollout.py)
    "PWR070": ("error", "a rollout stage has no evidence file"),
    "PWR071": ("error", "an evidence file is unreadable or not power.evidence/v1"),
    "PWR072": ("error", "the evidence does not prove losslessness"),
    "PWR073": ("error", "the evidence shows no speedup over the incumbent on a served traffic shape"),
    "PWR074": ("error", "the evidence shows unexpected replays or fallbacks"),
    "PWR075": ("error", "the evidence is for another plan than the one being rolled out"),
    "PWR076": ("error", "no rollout in progress, or one already in progress"),
    "PWR077": ("error", "the evidence was measured on another engine than the deployment runs"),
    "PWR078": ("error", "a bench sweep cannot be built (bad --sweep value, changed sources, a variant "
                        "that does not compile)"),
    "PWR079": ("error", "a bench option the engine cannot honour (--write-env for vLLM)"),
    # PWR08x Power's own documents: plans (documents/plan.py), fleet locks past PWR06x (orchestrator/fleet/lock.py)
    "PWR080": ("error", "the plan file cannot be read or is not a Power plan"),
    "PWR081": ("error", "the plan does not match the plan schema"),
    "PWR082": ("error", "the plan was edited after it was compiled (its digest does not match)"),
    "PWR083": ("error", "the fleet lock belongs to another fleet"),
    # PWR09x Kubernetes renders of a fleet or a plan (orchestrator/kubernetes/)
    "PWR090": ("error", "the fleet declares no [kubernetes] settings"),
    "PWR091": ("error", "a host has no node selection (node_name or node_selector)"),
    "PWR092": ("error", "a deployment's model volume is not declared"),
    "PWR093": ("error", "a planned artifact lies outside its model volume's local folder"),
    "PWR094": ("error", "two deployments map to one Kubernetes object name"),
    "PWR095": ("error", "a rollout's staged deployment runs neither the incumbent nor the candidate "
                        "plan in the fleet file"),
    "PWR096": ("error", "two deployments share one GPU in a cluster (each pod requests its GPUs whole)"),
    "PWR097": ("error", "a value the Kubernetes API server would reject (label value, node name, label key, "
                        "mount path, user id)"),
    # --- PWR1xx: artifacts (GGUF header, size, digest, quant, architecture) -
    # PWR10x the GGUF file itself (artifacts/gguf_reader.py, digests.py): each names the byte offset
    "PWR100": ("error", "the artifact cannot be opened (missing, unreadable)"),
    "PWR101": ("error", "the artifact is not a regular file (a directory, a FIFO, a device)"),
    "PWR102": ("error", "not a GGUF file: wrong magic"),
    "PWR103": ("error", "unsupported GGUF version (only 3 is read)"),
    "PWR104": ("error", "the GGUF header is truncated: it ends inside a field"),
    "PWR105": ("error", "a count or length in the header exceeds what the file can hold"),
    "PWR106": ("error", "unknown metadata value type, or arrays nested too deep"),
    "PWR107": ("error", "a metadata key or tensor name appears twice"),
    "PWR108": ("error", "invalid tensor info: dimensions, unknown quant type, or a row not a whole number of blocks"),
    "PWR109": ("error", "tensor data lies outside the file, overlaps, or is misaligned (truncated data)"),
    "PWR116": ("error", "the artifact changed while it was being read or hashed"),
    "PWR117": ("error", "invalid metadata value (bad UTF-8 in a key, name or token; bad general.alignment)"),
    # PWR11x declared vs file (orchestrator/planning/checks/artifacts.py)
    "PWR110": ("error", "a declared artifact file does not exist"),
    "PWR111": ("error", "the declared size differs from the file's size"),
    "PWR112": ("error", "the declared sha256 differs from the file's digest"),
    "PWR113": ("error", "the declared quant differs from the file's header"),
    "PWR114": ("error", "the declared architecture differs from the file's header"),
    "PWR115": ("error", "the artifact differs from the sha256 the plan was compiled with"),
    # PWR12x what the runtime can load (runtime/gguf_weights.py, trunks, tokenizer); tensor widths
    # (artifacts/header_values.py) and types (artifacts/runtime_types.py) are refused by plan and verify first
    "PWR120": ("error", "the runtime implements no such architecture or tokenizer"),
    "PWR121": ("error", "a tensor or header key the runtime needs is missing, or a tensor's shape contradicts the "
                        "header (embedding_length, head_count)"),
    "PWR122": ("error", "a tensor's quant type Power's runtime cannot dequantise (refused in plans for it)"),
    # PWR123-125 header values the runtime trusts (artifacts/header_values.py): plan and runtime refuse alike
    "PWR123": ("error", "a header value is out of range or of the wrong type (0 heads, NaN epsilon, rope base 0, ...)"),
    "PWR124": ("error", "header values contradict each other or the tensors (block_count vs blocks present, "
                        "vocabulary vs embedding rows, heads vs KV heads)"),
    "PWR125": ("error", "a special token id the runtime uses lies outside the vocabulary"),
    # PWR126 the tensor data the runtime reads into place (runtime/finite_weights.py)
    "PWR126": ("error", "a tensor's weights or block scales hold NaN or Inf (refused as the runtime loads it)"),
    # PWR13x where an artifact is published (orchestrator/inputs/rules.py) and `power pull` (artifacts/pull/)
    "PWR130": ("error", "an artifact's `source` names neither or both of a Hub `repo` and a `url` (or "
                        "Hub keys with a url)"),
    "PWR131": ("error", "a source's revision is not a commit id (a branch, a tag, or none): not pinned"),
    "PWR132": ("error", "an artifact with a source declares no size or no sha256 to check the pulled bytes against"),
    "PWR133": ("error", "a source URL or Hub endpoint is not https (plain http only to a loopback address)"),
    "PWR134": ("error", "a pull could not fetch a file (unknown file or revision, refused, network error, cut short)"),
    "PWR135": ("error", "a pulled file's size differs from the declared size (the partial file is deleted)"),
    "PWR136": ("error", "a pulled file's sha256 differs from the declared sha256 (the partial file is deleted)"),
    "PWR137": ("error", "the Hub's own sha256 of a file (its LFS object id) differs from the manifest's"),
    "PWR138": ("error", "a download redirected to another scheme or host: not followed"),
    "PWR139": ("info", "`power pull --pin` wrote a commit, size or sha256 into the manifest"),
    "PWR140": ("error", "an artifact to pull has no source to fetch it from"),
    # --- PWR2xx: drafters (kind, contract, binding, auto resolution) --------
    # PWR21x kinds, binding, mode resolution (orchestrator/planning/checks/drafters.py, resolve.py)
    "PWR210": ("error", "the drafter's header is another kind than the manifest declares"),
    "PWR211": ("error", "the drafter's header breaks its kind's contract (tensors, metadata)"),
    "PWR212": ("error", "native MTP requested but the target carries no nextn/MTP tensors"),
    "PWR213": ("error", "the drafter is bound to another target's sha256"),
    "PWR214": ("error", "`draft-model` is reserved: no production adapter, it fails closed"),
    "PWR215": ("error", "two context-backed drafters in one chain"),
    "PWR216": ("error", "the profile's mode cannot be served by the manifest (never downgraded)"),
    "PWR217": ("info", "how `auto` resolved"),
    "PWR218": ("info", "weight-free n-gram chained with a context-backed drafter"),
    # PWR219-PWR229 `power drafter distill` (drafters/distill.py)
    "PWR219": ("error", "`power drafter distill --kind mtp` for a target architecture with no MTP head layout"),
    # --- PWR3xx: tokenizer identity ----------------------------------------
    # PWR31x complete-vocabulary comparison (orchestrator/planning/checks/tokenizer.py)
    "PWR310": ("error", "the drafter's tokenizer differs from the target's"),
    "PWR311": ("info", "the drafter carries no tokenizer; it uses the target's"),
    # --- PWR4xx: speculation settings (K, S, FR, adaptive, flags) ----------
    # PWR40x/41x profile settings that need no artifact (orchestrator/inputs/schema.py, rules.py)
    "PWR401": ("error", "K (spec_draft_max) is not an integer from 1 to 64"),
    "PWR402": ("error", "S (spec_mtp_recurrent_snapshots) is not an integer from 1 to 4096"),
    "PWR403": ("error", "FR (spec_mtp_fr_vocab_size) is not an integer from 1 to 16,777,216"),
    "PWR404": ("error", "FR is set for a mode without a draft head (FR applies to mtp, dflash, dflash2 and dspark)"),
    "PWR405": ("error", "spec_mtp_adaptive is set for a mode the adaptive controller does not drive (dflash2 "
                        "keeps a fixed shape)"),
    "PWR406": ("info", "S < K: the guarded path (one exact replay, then every later round clamped to S)"),
    "PWR407": ("warning", "S > K: resident rollback state that is never used"),
    "PWR408": ("error", "runtime.verify_capacity is smaller than K+1"),
    "PWR409": ("error", "sampling.temperature is not a finite number >= 0"),
    "PWR410": ("warning", "spec_mode draft-model is reserved: a plan fails closed unless the runtime adapter exists"),
    "PWR411": ("error", "the n-gram window is empty (ngram_draft_min > the longest draft)"),
    # PWR44x/45x existing launch lines (orchestrator/launch/importer.py)
    "PWR440": ("error", "a word llama-server does not know (it stops at start: invalid argument)"),
    "PWR441": ("error", "an option without its value at the end of the launch line"),
    "PWR442": ("warning", "a `$VAR` in a unit's ExecStart that the unit does not define"),
    "PWR443": ("warning", "an engine-prefixed env variable the engine does not read (ignored silently)"),
    "PWR450": ("error", "`--spec-type mtp` is the pre-rename spelling (rejected at start, or silently no speculation)"),
    "PWR451": ("error", "a draft model is given without a `--spec-type`"),
    "PWR452": ("error", "two context-backed drafter types in one `--spec-type` list"),
    "PWR453": ("warning", "a drafter without a sliding window caches the whole context"),
    "PWR454": ("error", "a removed option or its env variable (llama-server stops at start with the error quoted)"),
    "PWR455": ("error", "an unknown speculative type"),
    "PWR456": ("error", "a removed vLLM flag (speculative flags, --swap-space)"),
    "PWR457": ("error", "`--speculative-config` is not a JSON object"),
    "PWR458": ("error", "the launch line names no model"),
    "PWR459": ("error", "the launch input cannot be read"),
    "PWR444": ("error", "a llama-server option Power refuses: what would run is not what the plan says "
                        "(orchestrator/engines/llama_server/options.py names each one and its fix)"),
    "PWR445": ("error", "a V cache type other than the K cache type (-ctv / --spec-draft-type-v): Power keeps one type "
                        "for both"),
    "PWR446": ("warning", "a llama-server request default or access setting the render does not carry (sampling "
                          "defaults, chat template, API key, TLS)"),
    "PWR447": ("error", "a model to download at start (-hf, --spec-draft-hf, -mu): Power records local files only"),
    # PWR46x renders (orchestrator/launch/render.py)
    "PWR460": ("error", "the engine cannot run this plan's speculation (refused by `plan` and "
                        "`fleet review`, and again by `render`)"),
    "PWR461": ("error", "a value cannot be written into this render target (control characters, unsplittable words)"),
    "PWR462": ("error", "the systemd unit cannot start Power: no absolute path to the power executable"),
    "PWR463": ("error", "the engine cannot load this plan's artifact (vLLM drafters are Hugging Face checkpoints)"),
    "PWR464": ("error", "the render's engine or host is not the one the plan was sized for (re-plan for it)"),
    # PWR47x live engines for `power bench --engine` (app/live.py)
    "PWR470": ("error", "the live engine's binary is not here (fail closed: nothing is measured)"),
    "PWR471": ("error", "the live engine exited or never answered /health"),
    "PWR472": ("error", "the live engine refused or dropped a request"),
    "PWR473": ("error", "the deployment's running server cannot be read, stopped or restored around a bench "
                        "(app/bench/standing.py)"),
    "PWR474": ("error", "--one-at-a-time asked of Power's runtime, which loads every plan in the bench's process"),
    "PWR475": ("error", "a --concurrency list that is not whole numbers, or a level above the plans' slots"),
    "PWR476": ("error", "the deployment's server runs in another PID namespace (a container or a Kubernetes pod): "
                        "Power does not stop it; stop it yourself and bench with --one-at-a-time "
                        "(app/bench/standing.py)"),
    "PWR477": ("error", "systemctl cannot confirm, stop or start the deployment's systemd unit "
                        "(app/bench/systemd_unit.py)"),
    "PWR478": ("error", "the deployment's server was left behind by a systemd unit that is no longer active: Power "
                        "neither stops nor starts it (app/bench/standing.py)"),
    # PWR42x settings checked against the artifacts (orchestrator/planning/checks/speculation.py)
    "PWR422": ("error", "FR vocabulary prefix larger than the target's vocabulary"),
    "PWR423": ("error", "FR set, but the resolved mode has no draft head to apply it to"),
    "PWR424": ("error", "retired: adaptive scheduling with auto resolved to DFlash2 (auto never chooses DFlash2 now)"),
    "PWR425": ("error", "K exceeds what the drafter can propose in one block"),
    "PWR426": ("error", "spec_draft_p_min set, but the resolved mode's speculator has no confidence gate"),
    "PWR427": ("error", "the n-gram's longest draft exceeds K, the drafts Power verifies per round"),
    # --- PWR5xx: memory -----------------------------------------------------
    # PWR50x sizing (orchestrator/planning/checks/memory.py, checks/devices.py, rules.py, sizing/)
    "PWR500": ("error", "the plan does not fit the device"),
    "PWR501": ("warning", "the plan fits only by eating into the headroom"),
    "PWR502": ("warning", "a drafter without a sliding window caches the whole context on the device"),
    "PWR503": ("info", "thin margin: the plan needs a quiet device"),
    "PWR504": ("error", "a size computed from the headers leaves 64 bits (a header value past physical sense)"),
    "PWR505": ("warning", "the micro-batch exceeds the batch: the engine clamps it to the batch"),
    "PWR506": ("error", "runtime.tensor_split has a negative ratio or is all zero"),
    "PWR507": ("error", "runtime.tensor_split does not give one ratio per device of the deployment"),
    "PWR508": ("error", "runtime.main_gpu is not one of the deployment's devices"),
    "PWR509": ("error", "runtime.tensor_parallel does not divide the model's heads"),
    "PWR510": ("error", "the devices do not suit the engine (several devices for Power's runtime, a tensor-parallel "
                        "size other than the device count, a CPU among GPUs)"),
    "PWR511": ("error", "a quantized V cache without flash attention (llama-server refuses to start)"),
    "PWR512": ("error", "a KV cache type Power's runtime does not hold (it holds f32, f16, bf16 and q8_0)"),
    "PWR513": ("error", "a q8_0 KV cache for key/value heads whose width is not a whole number of 32-value blocks"),
    "PWR514": ("error", "a q8_0 KV cache on the GPU path, whose attention reads f32, f16 and bf16 caches"),
    # PWR52x the host's memory at load time (runtime/host_memory.py)
    "PWR520": ("error", "the host cannot hold the weights the runtime would load (refused before "
                        "loading, with both figures)"),
    # PWR53x the drafter's placement (checks/devices.py, engines/)
    "PWR530": ("error", "runtime.draft_device is not one of the deployment's GPUs"),
    "PWR531": ("error", "the drafter's own device, offloaded layers or KV type asked of an engine that runs it with "
                        "the target"),
    "PWR532": ("error", "a runtime.draft_override_tensor entry that is not PATTERN=CPU or PATTERN=CUDA<n> with a "
                        "pattern that compiles and a GPU of the deployment"),
    # --- PWR6xx: the runtime (runtime/) ------------------------------------
    "PWR600": ("error", "a runtime setting or request the runtime cannot serve"),
    "PWR601": ("error", "the device or weight dtype is not available here"),
    "PWR602": ("error", "the prompt does not fit the planned context"),
    "PWR603": ("error", "the plan's speculator cannot serve this target (it declined; never downgraded)"),
    "PWR604": ("error", "the server cannot listen on the address (port taken, unknown host, not permitted)"),
    "PWR605": ("error", "the chat template is missing, does not compile, or refused the messages"),
    "PWR606": ("error", "the API key file cannot be read or holds no usable key"),
    "PWR607": ("error", "the plan's CUDA graphs cannot be captured for this target or device (never run without them)"),
    "PWR620": ("error", "the CPU kernel cache is not a folder this user owns and no one else can write"),
    "PWR621": ("error", "a CPU kernel library in the cache is not the one this installation built (digest, size, "
                        "owner or mode); refused, not loaded"),
    "PWR622": ("error", "the CPU kernels cannot be built (no C++20 compiler, OpenMP or ninja) or do not load"),
    "PWR623": ("error", "another process held the CPU kernel build lock past the wait bound"),
    "PWR624": ("error", "the requested CPU instruction path is unknown or this CPU (or Linux) cannot run it"),
    # PWR65x what the runtime loads (runtime/gguf_weights.py)
    "PWR650": ("error", "the artifact holds no tensor data (a header-only replica): nothing to run"),
    "PWR651": ("warning", "the plan asks for CUDA graphs the runtime cannot capture for this target (a recurrent "
                          "trunk): a run on a CUDA device is refused at load (PWR607)"),
    "PWR652": ("error", "POWER_KERNEL_WAIT names no wait for Power's kernel threads (sleep, spin or adaptive)"),
}


EXIT_CODES = """Every command exits 0 when all is well (warnings and info findings allowed), 1 when any
error finding was reported, and 2 on a usage or input error: a bad option, a path that does
not exist (PWR001), a directory or glob with no .toml file (PWR009). A file that exists but
cannot be used (FIFO or device PWR002, too large PWR003, empty PWR004, binary PWR005, not
UTF-8 PWR006, bad TOML PWR007/PWR008, bad `schema` PWR010/PWR011) is a finding: exit 1.

A finding prints as `FILE:LINE:COL: CODE [severity] message`, then the source line with
carets under the whole offending key or value (a value that goes on over more lines is
underlined to the end of its first line), then `hint: ...`; an artifact finding names a
byte offset instead of a line. With `--json` each finding is an object with `code`,
`severity`, `message`, `file`, `line`, `col`, `end_col` (just past the offending text:
`end_col - col` characters), `hint`, `offset` and `where` (the dotted key path).

"""


def title(code: str) -> str:
    return CODES[code][1]


def markdown_table() -> str:
    rows = ["| code | severity | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{code}` | {sev} | {text} |" for code, (sev, text) in sorted(CODES.items())]
    return (
        "# Check codes\n\nStable codes; never renumbered. Generated from `power/codes.py`.\n\n"
        + EXIT_CODES
        + "\n".join(rows)
        + "\n"
    )


if __name__ == "__main__":
    print(markdown_table(), end="")
