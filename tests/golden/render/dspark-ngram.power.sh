#!/usr/bin/env bash
# Power runtime launch for plan qwen3.6-27b-q6k-dspark (digest 33240203f45e23a3e9183f5b61ce45ce0ec17ffaa03301df0370d729b768d0e4)
# mode dspark, K=10 S=6 (guarded rollback)
set -euo pipefail
exec power serve <golden>/dspark-ngram.power.plan.json
