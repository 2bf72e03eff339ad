#!/usr/bin/env bash
# Power runtime launch for plan qwen3.6-27b-q6k-dspark (digest 539060189bb1a3b571b6dc47f7543f9664de758872376810d5cce6d1aaeb6ad6)
# mode dspark, K=10 S=6 (guarded rollback)
set -euo pipefail
exec power serve <golden>/dspark-ngram.plan.json
