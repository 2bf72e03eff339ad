#!/usr/bin/env bash
# Power runtime launch for plan qwen3.6-27b-q6k-dspark (digest 24b684bf3db96c80252c5e3f11e936f5e5382125736d75c8dee87fa2ae390c99)
# mode dspark, K=10 S=6 (guarded rollback)
set -euo pipefail
exec power serve <golden>/dspark-ngram.plan.json
