"""What the orchestrator and the runtime exchange: the resolved plan, the receipt, the arithmetic a plan may name."""
