"""llama-server's context parameters, derived from the launch settings exactly as the engine derives them.

Sources (llama.cpp as vendored in llama-cpp-python 0.3.36, commit 0c1e570):

- `tools/server/server-context.cpp` `server_output_limits` and `common/speculative.cpp`
  `common_speculative_get_output_limits`: the server reserves
  `n_outputs_max = min(-b, n_parallel x (1 + n_draft))` logits rows (at least 1),
  n_draft being the longest draft of the enabled `--spec-type`s
  (`common_speculative_n_max`);
- `src/llama-context.cpp` `llama_context::llama_context`: with causal attention
  `n_batch = min(n_ctx, -b)` (the context as given, before padding),
  `n_ubatch = min(n_batch, -ub)`; then `n_ctx = GGML_PAD(n_ctx, 256)`; unified
  KV: `n_ctx_seq = n_ctx`; otherwise `n_ctx_seq = GGML_PAD(n_ctx / n_seq_max, 256)`
  and `n_ctx = n_ctx_seq x n_seq_max` (which can grow the context: -c 4096 -np 3
  gives 3 x 1536 = 4608 cells);
- `src/llama-kv-cache-iswa.cpp`: a sliding-window cache keeps
  `GGML_PAD(min(n_ctx_seq, n_swa x (unified ? n_seq_max : 1) + n_ubatch), 256)`
  cells per stream; streams = 1 when unified, n_seq_max otherwise
  (`llama_kv_cache`: `n_stream = unified ? 1 : n_seq_max`);
- `common/common.h` `need_n_rs_seq`: recurrent state keeps `--spec-draft-n-max`
  extra rows per sequence when a draft-mtp/eagle3/dflash/dspark type runs;
- `tools/server/server-context.cpp` `n_ctx_slot`: a slot's usable context is
  `min(n_ctx_seq, n_ctx_train)`.
"""

from __future__ import annotations

from dataclasses import dataclass

from power import modes
from power.orchestrator.engines.sizing.model import Request, SlotFacts, pad

# llama_context pads the context and the sliding-window cache to 256 cells.
N_CTX_PAD = 256


@dataclass(frozen=True)
class LlamaContext:
    """cparams of one llama_context, plus the server facts derived from them."""

    n_ctx: int
    n_ctx_seq: int
    n_seq_max: int
    kv_unified: bool
    n_batch: int
    n_ubatch: int
    n_outputs_max: int
    n_rs_seq: int
    flash_attn: bool

    @property
    def n_stream(self) -> int:
        return 1 if self.kv_unified else self.n_seq_max

    def sliding_cells(self, n_swa: int) -> int:
        """Cells per stream of the sliding-window cache (llama_kv_cache_iswa's size_swa)."""
        per_stream_window = n_swa * (self.n_seq_max if self.kv_unified else 1)
        return pad(min(self.n_ctx_seq, per_stream_window + self.n_ubatch), N_CTX_PAD)

    def reserve_tokens(self) -> int:
        """Tokens of the worst-case graph `sched_reserve` builds: min(n_ctx, n_ubatch), rounded up to a multiple of
        n_seq_max (`graph_reserve` splits them evenly over the sequences)."""
        tokens = min(self.n_ctx, self.n_ubatch)
        return pad(tokens, self.n_seq_max)

    def reserve_outputs(self) -> int:
        """Output rows of that graph: min(its tokens, n_outputs_max)."""
        return min(self.reserve_tokens(), self.n_outputs_max)


def target_context(request: Request, architecture: str) -> LlamaContext:
    """The target's llama_context, for a target of `architecture`, for llama-server launched with the request's
    settings."""
    outputs = max(1, min(request.batch, request.slots * (1 + draft_length(request))))
    return _context(request.ctx, request, outputs, rollback_rows(request, architecture))


def draft_context(request: Request, target: LlamaContext) -> LlamaContext:
    """The draft context `common_speculative_init_result` makes (common/speculative.cpp): the target's whole n_ctx,
    the same slots, batches and unified setting, no recurrent rollback rows, and n_outputs_max = n_parallel (a
    DFlash/DSpark block draft: n_parallel x (n_max + 1), `common_base_params_to_speculative`)."""
    outputs = request.slots * (draft_length(request) + 1) if block_draft(request) else request.slots
    return _context(target.n_ctx, request, max(1, outputs), 0)


def _context(ctx: int, request: Request, n_outputs_max: int, n_rs_seq: int) -> LlamaContext:
    n_seq = max(1, request.slots)
    n_batch = min(ctx, request.batch)
    n_ubatch = min(n_batch, request.ubatch)
    n_ctx = pad(ctx, N_CTX_PAD)
    if request.kv_unified:
        n_ctx_seq = n_ctx
    else:
        n_ctx_seq = pad(n_ctx // n_seq, N_CTX_PAD)
        n_ctx = n_ctx_seq * n_seq
    return LlamaContext(n_ctx=n_ctx, n_ctx_seq=n_ctx_seq, n_seq_max=n_seq, kv_unified=request.kv_unified,
                        n_batch=n_batch, n_ubatch=n_ubatch, n_outputs_max=n_outputs_max, n_rs_seq=n_rs_seq,
                        flash_attn=request.flash_attn)


def slot_facts(context: LlamaContext, n_swa: int | None) -> SlotFacts:
    return SlotFacts(slots=context.n_seq_max, kv_unified=context.kv_unified, engine_ctx=context.n_ctx,
                     ctx_per_slot=context.n_ctx_seq, kv_streams=context.n_stream,
                     sliding_cells=context.sliding_cells(n_swa) if n_swa else None,
                     batch=context.n_batch, ubatch=context.n_ubatch, outputs=context.n_outputs_max)


# llama.cpp's speculative types, as common/speculative.cpp and common/common.h treat them:
# the draft length each reserves outputs for (common_speculative_n_max), which keep recurrent rollback rows
# (need_n_rs_seq) and which decode a whole block in their draft context (common_base_params_to_speculative).
DRAFT_N_MAX_TYPES = frozenset({"draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark"})
NGRAM_MOD_TYPE = "ngram-mod"
ROLLBACK_ROW_TYPES = frozenset({"draft-mtp", "draft-eagle3", "draft-dflash", "draft-dspark"})
BLOCK_DRAFT_TYPES = frozenset({"draft-dflash", "draft-dspark"})
# src/llama-arch.cpp llm_arch_supports_rs_rollback: other architectures get n_rs_seq clamped to 0.
ROLLBACK_ARCHITECTURES = frozenset({"kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next",
                                    "nemotron_h", "nemotron_h_moe", "lfm2", "lfm2moe", "bailingmoe3"})


def spec_types(request: Request) -> tuple[str, ...]:
    """The `--spec-type` list the request's chain renders as (its modes' llama.cpp spellings)."""
    return tuple(t for kind in request.chain if (t := modes.llama_spec_type(kind)) is not None)


def draft_length(request: Request) -> int:
    """The longest draft a slot verifies: `--spec-draft-n-max` (K) for a draft type, `--spec-ngram-mod-n-max` for
    ngram-mod (common_speculative_n_max)."""
    types = spec_types(request)
    lengths = [request.draft_max for t in types if t in DRAFT_N_MAX_TYPES]
    lengths += [request.ngram_draft_max for t in types if t == NGRAM_MOD_TYPE]
    return max(lengths, default=0)


def rollback_rows(request: Request, architecture: str) -> int:
    """n_rs_seq: the recurrent rows a sequence keeps for a partial rollback, K for a rollback type on an
    architecture that supports it (need_n_rs_seq), else 0."""
    rolls_back = any(t in ROLLBACK_ROW_TYPES for t in spec_types(request)) and architecture in ROLLBACK_ARCHITECTURES
    return request.draft_max if rolls_back else 0


def block_draft(request: Request) -> bool:
    """Whether the draft context decodes a whole block (DFlash, DSpark: common_base_params_to_speculative)."""
    return any(t in BLOCK_DRAFT_TYPES for t in spec_types(request))
