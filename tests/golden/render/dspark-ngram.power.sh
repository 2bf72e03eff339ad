#!/usr/bin/env bash
# Power runtime launch for plan qwen3.6-27b-q6k-dspark (digest 9b836242bdcdb8da31bf0b6978168f00877f477415217eeaed9fc63b2cfd32ec)
# mode dspark, K=10 S=6 (guarded rollback)
set -euo pipefail
exec power serve <golden>/dspark-ngram.plan.json
