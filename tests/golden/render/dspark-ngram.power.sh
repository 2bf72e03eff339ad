#!/usr/bin/env bash
# Power runtime launch for plan qwen3.6-27b-q6k-dspark (digest 2fe6268e6ba2207ff7ab017a9545f84e399dc2dad21f6a5862bc94638bb4fbc5)
# mode dspark, K=10 S=6 (guarded rollback)
set -euo pipefail
exec power serve <golden>/dspark-ngram.plan.json
