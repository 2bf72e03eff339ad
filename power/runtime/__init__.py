"""Power's runtime: GGUF weights, trunks, speculators, the speculative transaction, sampling, receipts."""
