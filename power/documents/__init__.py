"""What the orchestrator and the runtime exchange: the resolved plan, the receipt, the weight dtypes a plan may name."""
