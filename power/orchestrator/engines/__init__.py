"""The engine adapters, one per engine, and the registry that names them (docs/architecture.md)."""

from __future__ import annotations

from power.orchestrator.engines.base import Asked, AskedDrafter, EngineAdapter, Launch, Refusal, Setting, Settings
from power.orchestrator.engines.llama_server import LlamaServer
from power.orchestrator.engines.power import PowerRuntime
from power.orchestrator.engines.vllm import Vllm

ADAPTERS: dict[str, EngineAdapter] = {adapter.name: adapter for adapter in (PowerRuntime(), LlamaServer(), Vllm())}
ENGINES: tuple[str, ...] = tuple(ADAPTERS)
# The engine a deployment or `power plan` runs on when none is named.
DEFAULT_ENGINE = "power"


def adapter(name: str) -> EngineAdapter:
    """The adapter of engine `name`; KeyError for an engine Power does not know (the schema's Literal refuses it)."""
    return ADAPTERS[name]


__all__ = ["ADAPTERS", "DEFAULT_ENGINE", "ENGINES", "Asked", "AskedDrafter", "EngineAdapter", "Launch", "Refusal",
           "Setting", "Settings", "adapter"]
