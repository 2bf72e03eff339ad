"""The engines, one folder each, and the registry that names them (docs/architecture.md, "Adding an engine")."""

from __future__ import annotations

from power.orchestrator.engines.base import (
    Asked,
    AskedDrafter,
    EngineAdapter,
    Launch,
    LiveBench,
    Refusal,
    Setting,
    Settings,
)
from power.orchestrator.engines.llama_server.adapter import LlamaServer
from power.orchestrator.engines.power.adapter import PowerRuntime
from power.orchestrator.engines.vllm.adapter import Vllm

ADAPTERS: dict[str, EngineAdapter] = {adapter.name: adapter for adapter in (PowerRuntime(), LlamaServer(), Vllm())}
ENGINES: tuple[str, ...] = tuple(ADAPTERS)
# The engines `power import` reads a launch line of, and those `power bench` runs as a live process.
IMPORTABLE: tuple[str, ...] = tuple(name for name, engine in ADAPTERS.items() if engine.launch_reader is not None)
LIVE_ENGINES: tuple[str, ...] = tuple(name for name, engine in ADAPTERS.items() if engine.live is not None)
# Each render target and the engine it launches (the env file and the systemd unit start Power's runtime).
TARGET_ENGINES: dict[str, str] = {target: name for name, engine in ADAPTERS.items() for target in engine.targets}


def adapter(name: str) -> EngineAdapter:
    """The adapter of engine `name`; KeyError for an engine Power does not know (the schema's Literal refuses it)."""
    return ADAPTERS[name]


__all__ = ["ADAPTERS", "ENGINES", "IMPORTABLE", "LIVE_ENGINES", "TARGET_ENGINES", "Asked",
           "AskedDrafter", "EngineAdapter", "Launch", "LiveBench", "Refusal", "Setting", "Settings", "adapter"]
