"""llama-server: what it runs, its sizing and its command line, written through its settings table (`settings`)."""

from __future__ import annotations

from pathlib import Path

from power import modes
from power.artifacts.facts import ArtifactFacts
from power.documents.plan import ResolvedPlan
from power.orchestrator.engines.base import Asked, EngineAdapter, Launch, Refusal, Settings, options
from power.orchestrator.engines.common import tensor_parallel_refusal, unsupported_notes, visible_devices
from power.orchestrator.engines.llama_server import flags, reader
from power.orchestrator.engines.llama_server.live import LIVE
from power.orchestrator.engines.llama_server.settings import ENV_PREFIX, NAME, settings_table
from power.orchestrator.engines.llama_server.sizing import size_llama_server
from power.orchestrator.engines.sizing.model import DeviceBudget, Request, Sizing, is_quantized
from power.orchestrator.inputs.launch_lines.tokens import EnvNames


class LlamaServer(EngineAdapter):
    name = NAME
    description = "llama-server"
    multi_device = "a layer split (-sm layer -ts)"
    targets = ("llama-server", "llama-server-env")
    env_target = "llama-server-env"
    live = LIVE
    launch_reader = staticmethod(reader.read)

    @property
    def settings(self) -> Settings:  # type: ignore[override]
        return settings_table()

    def supports(self, asked: Asked) -> list[Refusal]:
        refusals = []
        for kind in asked.chain:
            document, where = asked.drafter_where(kind)
            if modes.llama_spec_type(kind) is None:
                why = modes.mode(kind).llama_refusal or f"llama-server has no {kind} speculative type"
                refusals.append(Refusal("PWR460", why, "run this deployment with the engine that runs it (`power "
                                        "plan --engine`), or choose a mode llama-server runs", document, where))
        if is_quantized(asked.kv_cache_type) and not asked.flash_attn:
            refusals.append(Refusal(
                "PWR511", f"kv_cache_type = \"{asked.kv_cache_type}\" quantizes the V cache, which llama-server only "
                "runs with flash attention (it stops at start: \"quantized V cache was requested, but this requires "
                "Flash Attention\")", "set flash_attn = true, or kv_cache_type = \"f16\"", "profile",
                "runtime.kv_cache_type"))
        return refusals + asked.checkpoint_refusals("llama-server") + tensor_parallel_refusal(self.name, asked)

    def size(self, target: ArtifactFacts, drafter: ArtifactFacts | None, request: Request,
             devices: tuple[DeviceBudget, ...]) -> Sizing:
        return size_llama_server(target, drafter, request, devices)

    def program_word(self, word: str) -> bool:
        name = Path(word).name
        return name in {"llama-server", "server"} or name.startswith("llama-server")

    def stated_default(self, flag: str) -> str | None:
        option = flags.table().lookup(flag)
        stated = option.default.split(",")[0].strip() if option is not None and option.default else None
        return f"llama.cpp's default {stated}" if stated else None

    def env_names(self) -> EnvNames:
        return EnvNames(ENV_PREFIX, {env: option.name for env, option in flags.table().by_env.items()})

    def splits_layers(self, devices: int, request: Request) -> bool:
        return devices > 1 and request.split.mode == "layer"

    def launch(self, plan: ResolvedPlan, plan_path: Path, root: Path | None = None) -> Launch:  # noqa: ARG002
        flag = self.settings.flag
        chain = plan.mode.chain
        rt, sampling = plan.runtime, plan.sampling
        args: list[tuple[str, object]] = [
            (flag("model"), plan.target.path),
            (flag("alias"), plan.name),
            (flag("ctx"), rt.ctx),
            (flag("slots"), rt.slots),
            (self.settings.switch("kv_unified", rt.kv_unified), None),
            (flag("batch"), rt.batch),
            (flag("ubatch"), rt.ubatch),
            (flag("gpu_layers"), rt.gpu_layers),
            (flag("flash_attn"), "auto" if rt.flash_attn == "auto" else "on" if rt.flash_attn else "off"),
            # llama-server's default `--fit on` resizes unset arguments to the free memory it finds at start, so
            # what would run could differ from the plan (common/fit.cpp); the plan's sizing is the one that holds.
            (flag("fit"), "off"),
            (flag("kv_cache_type"), rt.kv_cache_type),
            (flag("kv_cache_type_v"), rt.kv_cache_type),
            (flag("seed"), sampling.seed),
            (flag("temperature"), sampling.temperature),
            # Power samples from the plain temperature distribution: llama.cpp's default top-k/top-p/min-p cuts are off.
            (flag("top_k"), 0),
            (flag("top_p"), 1.0),
            (flag("min_p"), 0.0),
            # the counters the A/B protocol and the fleet read (llama-server serves /metrics only when asked)
            (flag("metrics"), None),
        ]
        if chain:
            args.append((flag("spec_type"), ",".join(str(modes.llama_spec_type(kind)) for kind in chain)))
        drafting = [d for d in plan.drafters if d.kind not in modes.WEIGHT_FREE]
        if drafting:
            args.append((flag("k"), plan.speculation.k))
            args += [(flag("draft_kv_cache_type"), rt.draft_kv_cache_type),
                     (flag("draft_kv_cache_type_v"), rt.draft_kv_cache_type)]
            if rt.draft_device is not None:
                args.append((flag("draft_device"), rt.draft_device))
            if rt.draft_gpu_layers != "all":
                args.append((flag("draft_gpu_layers"), rt.draft_gpu_layers))
            if rt.draft_override_tensor:
                args.append((flag("draft_override_tensor"), ",".join(rt.draft_override_tensor)))
            if plan.speculation.p_min is not None:
                args.append((flag("p_min"), plan.speculation.p_min))
        args += [(flag("draft_model"), d.path) for d in drafting if d.path is not None]
        if any(kind in modes.WEIGHT_FREE for kind in chain):
            args += [(flag("ngram_match"), rt.ngram_match), (flag("ngram_draft_min"), rt.ngram_draft_min),
                     (flag("ngram_draft_max"), rt.ngram_draft_max)]
        args += self._split_options(plan)
        notes = unsupported_notes(plan) if chain else []
        env = {"GGML_CUDA_DISABLE_GRAPHS": "1"} if not rt.cuda_graphs else {}
        return Launch(("llama-server",), options(args), env | visible_devices(plan), tuple(notes))

    def _split_options(self, plan: ResolvedPlan) -> list[tuple[str, object]]:
        """Several devices: the layer split the plan was sized for (-sm layer -ts, one ratio per device in order),
        or the main device alone (-sm none -mg)."""
        rt, flag = plan.runtime, self.settings.flag
        if len(plan.devices) < 2:
            return []
        if rt.split_mode == "none":
            return [(flag("split_mode"), "none"), (flag("main_gpu"), rt.main_gpu)]
        return [
            (flag("split_mode"), "layer"),
            (flag("tensor_split"), ",".join(f"{r:g}" for r in rt.tensor_split or ())),
        ]
