"""The only place that knows which speculation algorithms exist.

A factory either builds a speculator for the target it is given or returns a
`Decline` saying why it cannot (no draft head in the file, a drafter bound to
another target, ...). `create` turns a decline into `SpeculatorDeclined`, so an
explicitly requested mode fails closed instead of silently decoding plainly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ..contract import Trunk
from .base import Decline, Speculator, SpeculatorDeclined


@dataclass(frozen=True)
class SpeculatorRequest:
    trunk: Trunk
    max_draft: int  # K
    drafter_path: Path | None = None  # an external drafter artifact (dflash, dflash2, dspark)
    target_path: Path | None = None  # the target GGUF (native heads such as mtp live in it)
    options: Mapping[str, Any] = field(default_factory=dict)


Factory = Callable[[SpeculatorRequest], "Speculator | Decline"]


def _ngram(request: SpeculatorRequest) -> Speculator | Decline:
    from .ngram import NGramSpeculator

    return NGramSpeculator(
        min_order=int(request.options.get("ngram_min", 2)), max_order=int(request.options.get("ngram_max", 4))
    )


def _block_drafter(kind: str) -> Factory:
    def build(request: SpeculatorRequest) -> Speculator | Decline:
        from power.orchestrator.contracts import classify_drafter

        from ..gguf_weights import GGUFFile
        from .dflash import BlockDrafter, header_view
        from .dspark import DSparkDrafter
        from .target_head import TargetHead

        if request.drafter_path is None or request.target_path is None:
            return Decline(kind, f"needs a {kind} drafter artifact and the target GGUF; the plan names none")
        drafter = GGUFFile(request.drafter_path)
        found = classify_drafter(header_view(drafter))
        if found != kind:
            return Decline(kind, f"{request.drafter_path} is a {found or 'non-drafter'} artifact by its header, not {kind}")
        config = request.trunk.config
        width = drafter.get(f"{drafter.architecture}.embedding_length")
        if width != config.d_model:
            return Decline(kind, f"drafter width {width} does not match the target's d_model {config.d_model}")
        layers = drafter.get(f"{drafter.architecture}.target_layers", [])
        if any(not 0 <= layer <= config.n_layers for layer in layers):
            return Decline(kind, f"drafter reads target layers {list(layers)}; the target has {config.n_layers}")
        head = TargetHead.load(request.target_path, request.options.get("fr_vocab"))
        if kind != "dspark":
            return BlockDrafter(drafter, head, context_rows=config.n_ctx, guard_rows=config.verify_capacity)
        dspark = DSparkDrafter(drafter, head, context_rows=config.n_ctx, guard_rows=config.verify_capacity)
        dspark.threshold_override = request.options.get("confidence_threshold")
        return dspark

    return build


def _mtp(request: SpeculatorRequest) -> Speculator | Decline:
    from power.orchestrator.contracts import nextn_layer_count

    from ..gguf_weights import GGUFFile
    from .dflash import header_view
    from .mtp import MTPHead
    from .target_head import TargetHead

    if request.target_path is None:
        return Decline("mtp", "needs the target GGUF (the nextn head lives in it)")
    target = GGUFFile(request.target_path)
    if nextn_layer_count(header_view(target)) == 0:
        return Decline("mtp", f"{request.target_path} carries no nextn/MTP head ({target.architecture}.nextn_predict_layers)")
    if target.architecture != "qwen35":
        return Decline("mtp", f"the runtime's MTP head is implemented for qwen35 targets, not {target.architecture}")
    return MTPHead(target, TargetHead(target, request.options.get("fr_vocab")), request.trunk.config.n_ctx)


_FACTORIES: dict[str, Factory] = {
    "ngram": _ngram,
    "mtp": _mtp,
    "dflash": _block_drafter("dflash"),
    "dflash2": _block_drafter("dflash2"),
    "dspark": _block_drafter("dspark"),
}


def names() -> tuple[str, ...]:
    return tuple(_FACTORIES)


def build(name: str, request: SpeculatorRequest) -> Speculator | Decline:
    """The speculator, or the reason it cannot serve this target."""
    factory = _FACTORIES.get(name)
    if factory is None:
        return Decline(name, f"no such speculator; known: {', '.join(names())}")
    return factory(request)


def create(name: str, request: SpeculatorRequest) -> Speculator:
    """The speculator; raises SpeculatorDeclined (fail closed) when it cannot serve this target."""
    built = build(name, request)
    if isinstance(built, Decline):
        raise SpeculatorDeclined(built)
    return built
