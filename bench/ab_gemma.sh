#!/usr/bin/env bash
# The A/B protocol on the bundled Gemma 3 270M: n-gram speculation (profiles/ngram.toml) against the zero-draft
# target-only control, over all four traffic shapes, in one process. Figures: docs/bench.md.
#
#   bench/ab_gemma.sh [OUT_DIR]        (RUNS, MAX_TOKENS, THREADS override the defaults 3, 64, 1)
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
out="${1:-out/bench}"
mkdir -p "$out"
power plan manifests/gemma3-270m.toml profiles/ngram.toml --device "24 GiB" -o "$out/ngram.plan.json" > /dev/null
power plan manifests/gemma3-270m.toml profiles/target-only.toml --device "24 GiB" -o "$out/target-only.plan.json" > /dev/null
power bench "$out/ngram.plan.json" --vs "$out/target-only.plan.json" --runs "${RUNS:-3}" --max-tokens "${MAX_TOKENS:-64}" \
  --threads "${THREADS:-1}" -o "$out/evidence.json" --report "$out/report.md"
