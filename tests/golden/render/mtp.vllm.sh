#!/usr/bin/env bash
# vLLM launch rendered by Power from plan qwen3.6-27b-q6k-mtp
# plan digest 343d6b8b7d6d116baa1146de49608ca325a97c5313f3c7667e5bd4164157804c; mode mtp (requested; the target carries nextn tensors)
# kv cache type q8_0: vLLM has no such --kv-cache-dtype; it uses the model dtype
# S = 6 recurrent snapshots (guarded rollback): no flag; the engine keeps its own rollback state
# FR = 8192 draft-only token-ID prefix: no flag; the draft head projects the full vocabulary
# fixed verification capacity 11 rows: no flag
set -euo pipefail
exec vllm serve /srv/models/Qwen3.6-27B-Q6_K.gguf \
  --enforce-eager \
  --served-model-name qwen3.6-27b-q6k-mtp \
  --max-model-len 4096 \
  --seed 0 \
  --speculative-config '{"method": "mtp", "num_speculative_tokens": 7}'
