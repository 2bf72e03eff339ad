#!/usr/bin/env bash
# Power runtime launch for plan qwen3.6-27b-q6k-dspark (digest a7b57175eda4f3db19a04baab4e9f37cb66efc071fe4d54b2b4275341c8b3a88)
# mode dspark, K=10 S=6 (guarded rollback)
set -euo pipefail
exec power serve <golden>/dspark-ngram.power.plan.json
