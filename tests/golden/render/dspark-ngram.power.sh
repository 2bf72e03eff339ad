#!/usr/bin/env bash
# Power runtime launch for plan qwen3.6-27b-q6k-dspark (digest 4f0584080d0eb56cb686d64dc5e37fe89736e4648293f8879afb1328bb3c34d9)
# mode dspark, K=10 S=6 (guarded rollback)
set -euo pipefail
exec power serve <golden>/dspark-ngram.plan.json
