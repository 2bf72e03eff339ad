#!/usr/bin/env bash
# llama-server launch rendered by Power from plan qwen3.6-27b-q6k-dspark
# plan digest de36b6c6033af0e25d6148807c22e58b96cc54389747c127e263c4b60857e086; mode dspark (verified external artifact)
# S = 6 recurrent snapshots (guarded rollback): no flag; the engine keeps its own rollback state
# adaptive K/S controller: no flag; the engine drafts a fixed K per round
# fixed verification capacity 11 rows: no flag
set -euo pipefail
exec llama-server \
  -m /srv/models/Qwen3.6-27B-Q6_K.gguf \
  --alias qwen3.6-27b-q6k-dspark \
  -c 512 \
  -np 1 \
  --no-kv-unified \
  -b 12 \
  -ub 512 \
  -ngl all \
  -fa off \
  --fit off \
  -ctk f16 \
  -ctv f16 \
  --seed 0 \
  --temp 0.0 \
  --top-k 0 \
  --top-p 1.0 \
  --min-p 0.0 \
  --metrics \
  --spec-type ngram-mod,draft-dspark \
  --spec-draft-n-max 10 \
  --spec-draft-type-k q8_0 \
  --spec-draft-type-v q8_0 \
  --spec-draft-device CUDA0 \
  --spec-draft-p-min 0.5 \
  --spec-draft-model /srv/models/Qwen3.6-27B-DSpark-Q4.gguf \
  --spec-ngram-mod-n-match 24 \
  --spec-ngram-mod-n-min 12 \
  --spec-ngram-mod-n-max 48
