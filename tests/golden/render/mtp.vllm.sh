#!/usr/bin/env bash
# vLLM launch rendered by Power from plan qwen3.6-27b-q6k-mtp
# plan digest 1b604b72595d667a9a6d12ff62e186784fcbbbbb73391cb65cccebc408f731e3; mode mtp (requested; the target carries nextn tensors)
# kv cache type q8_0: vLLM has no such --kv-cache-dtype; it uses the model dtype
# S = 6 recurrent snapshots (guarded rollback): no flag; the engine keeps its own rollback state
# FR = 8192 draft-only token-ID prefix: no flag; the draft head projects the full vocabulary
# fixed verification capacity 11 rows: no flag
set -euo pipefail
exec vllm serve /srv/models/Qwen3.6-27B-Q6_K.gguf \
  --enforce-eager \
  --served-model-name qwen3.6-27b-q6k-mtp \
  --max-model-len 4096 \
  --max-num-seqs 1 \
  --max-num-batched-tokens 1 \
  --seed 0 \
  --generation-config vllm \
  --gpu-memory-utilization 0.01 \
  --tokenizer /srv/models/Qwen3.6-27B-Q6_K.gguf \
  --speculative-config '{"method": "mtp", "num_speculative_tokens": 7}'
