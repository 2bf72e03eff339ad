#!/usr/bin/env bash
# llama-server launch rendered by Power from plan qwen3.6-27b-q6k-mtp
# plan digest 413c2606aecacb383b8bb0a46db1ccf4dc8054cd63ea7bf1e7c424c95c59a013; mode mtp (requested; the target carries nextn tensors)
# S = 6 recurrent snapshots (guarded rollback): no flag; the engine keeps its own rollback state
# FR = 8192 draft-only token-ID prefix: no flag; the draft head projects the full vocabulary
# fixed verification capacity 11 rows: no flag
set -euo pipefail
export GGML_CUDA_DISABLE_GRAPHS=1
exec llama-server \
  -m /srv/models/Qwen3.6-27B-Q6_K.gguf \
  --alias qwen3.6-27b-q6k-mtp \
  -c 4096 \
  -np 1 \
  --no-kv-unified \
  -b 1 \
  -ub 512 \
  -ngl all \
  -fa on \
  --fit off \
  -ctk q8_0 \
  -ctv q8_0 \
  --seed 0 \
  --temp 0.0 \
  --top-k 0 \
  --top-p 1.0 \
  --min-p 0.0 \
  --metrics \
  --spec-type draft-mtp \
  --spec-draft-n-max 7 \
  --spec-draft-type-k q8_0 \
  --spec-draft-type-v q8_0
