"""The artifact layer: GGUF headers, facts, tokenizer facts, drafter contracts, digests, fixtures, atomic writes.

Imported by the orchestrator and the runtime alike; it imports neither.
"""
