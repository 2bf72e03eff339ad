"""How `power bench --engine vllm` runs vLLM live and reads its counters."""

from __future__ import annotations

from power.orchestrator.engines.base import LiveBench

BINARY_ENV = "POWER_VLLM"
LIVE = LiveBench(
    binary_env=BINARY_ENV,
    native=False,
    # its /metrics counters a request is measured by (deltas around it)
    counters=("spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total",
              "spec_decode_num_drafts_total"),
    thread_flags=(),
    install_hint=f"install vLLM (pip install vllm) or set {BINARY_ENV}",
)
