"""How `power bench --engine llama-server` runs llama-server live and reads its counters."""

from __future__ import annotations

from power.orchestrator.engines.base import LiveBench

BINARY_ENV = "POWER_LLAMA_SERVER"
LIVE = LiveBench(
    binary_env=BINARY_ENV,
    native=True,
    # its /metrics counters a request is measured by (deltas around it)
    counters=("spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total",
              "spec_decode_num_drafts_total", "n_decode_total"),
    thread_flags=("--threads", "--threads-batch"),
    install_hint=f"build it with scripts/build-llama-server and pass --engine-binary PATH (or set {BINARY_ENV})",
)
