#!/usr/bin/env bash
# Power runtime launch for plan qwen3.6-27b-q6k-dspark (digest e92ca2850f5d8171c9dcc1e001d11eb7049a0bf6283496eb8158fcc16392f9ea)
# mode dspark, K=10 S=6 (guarded rollback)
set -euo pipefail
exec power serve <golden>/dspark-ngram.plan.json
