"""vLLM: its settings, what it runs (one speculative method, drafters as Hugging Face checkpoints), its sizing
(tensor parallelism, an estimate) and its command line (`vllm/engine/arg_utils.py` `EngineArgs`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from power import modes
from power.artifacts.facts import ArtifactFacts
from power.documents.plan import ResolvedPlan
from power.orchestrator.engines.base import Asked, EngineAdapter, Launch, Refusal, options
from power.orchestrator.engines.common import draft_placement_refusal, unsupported_notes, visible_devices
from power.orchestrator.engines.sizing.model import DeviceBudget, Request, Sizing
from power.orchestrator.engines.vllm import reader
from power.orchestrator.engines.vllm.live import LIVE
from power.orchestrator.engines.vllm.settings import KV_DTYPES, NAME, SETTINGS
from power.orchestrator.engines.vllm.sizing import size_vllm, tensor_parallel_issue

_HINT = 'run this deployment with engine "llama-server" or "power"'
# The target model types vLLM runs EAGLE-3 against, by substring of the target's model type
# (vllm/config/speculative.py `_verify_args`: "Eagle3 is only supported for ... models").
EAGLE3_TARGETS = ("llama", "qwen", "minicpm", "gpt_oss", "hunyuan_vl", "hunyuan_v1_dense", "afmoe")


class Vllm(EngineAdapter):
    name = NAME
    # vllm/entrypoints/openai/cli_args.py: --api-key, env VLLM_API_KEY
    api_key_env = "VLLM_API_KEY"
    description = "vLLM"
    settings = SETTINGS
    multi_device = "tensor parallelism (--tensor-parallel-size)"
    targets = ("vllm",)
    live = LIVE
    launch_reader = staticmethod(reader.read)

    def supports(self, asked: Asked) -> list[Refusal]:
        refusals = []
        if len(asked.chain) > 1:
            refusals.append(Refusal("PWR460", f"vLLM runs one speculative method; this plan chains "
                                    f"{' + '.join(asked.chain)}", _HINT, "profile", "spec_mode"))
        for kind in asked.chain[:1]:
            document, where = asked.drafter_where(kind)
            record = modes.mode(kind)
            if record.vllm_method is None:
                refusals.append(Refusal("PWR460", f"vLLM has no {kind} speculative method", 'run this deployment '
                                        'with engine "power"', document, where))
            elif record.vllm_refusal and not any(d.checkpoint for d in asked.drafters if d.kind == kind):
                refusals.append(Refusal("PWR463", record.vllm_refusal, _HINT + ", or give the drafter as its "
                                        "Hugging Face checkpoint (`files`, docs/files.md)", document, where))
            elif record.confidence_gate and asked.p_min:
                refusals.append(Refusal(
                    "PWR460", f"spec_draft_p_min = {asked.p_min:g}: vLLM's {kind} proposes every one of its "
                    "num_speculative_tokens; it has no draft confidence gate (llama.cpp's --spec-draft-p-min)",
                    "remove spec_draft_p_min for this deployment, or run it on llama-server or power", "profile",
                    "spec_draft_p_min"))
        for drafter in asked.drafters:
            if drafter.has_file and modes.mode(drafter.kind).sidecar:
                document, where = asked.drafter_where(drafter.kind)
                refusals.append(Refusal("PWR463", "vLLM reads an MTP head from the target checkpoint; this "
                                        "deployment's head is a separate MTP-only GGUF, which vLLM cannot attach",
                                        _HINT, document, where.replace(".kind", ".path")))
        if asked.tensor_parallel != asked.devices:
            refusals.append(Refusal(
                "PWR510", f"runtime.tensor_parallel = {asked.tensor_parallel}, but the deployment runs on "
                f"{asked.devices} device(s): vLLM shards each layer over exactly the devices it is given",
                f"set tensor_parallel = {asked.devices}, or give the deployment {asked.tensor_parallel} device(s)",
                "profile", "runtime.tensor_parallel"))
        return refusals + draft_placement_refusal(self.name, asked, kv_types=True)

    def program_word(self, word: str) -> bool:
        name = Path(word).name
        return name in {"vllm", "serve", "python", "python3", "-m"} or name.startswith("vllm.entrypoints")

    def target_refusals(self, target: ArtifactFacts, asked: Asked) -> list[Refusal]:
        issue = tensor_parallel_issue(target, asked.tensor_parallel)
        refusals = [Refusal("PWR509", issue, "use a tensor_parallel that divides the heads (1, 2, 4, ...)", "profile",
                            "runtime.tensor_parallel")] if issue else []
        model_type = target.architecture.replace("-", "_")
        if modes.EAGLE3 in asked.chain[:1] and not any(known in model_type for known in EAGLE3_TARGETS):
            document, where = asked.drafter_where(modes.EAGLE3)
            refusals.append(Refusal("PWR460", f"vLLM runs EAGLE-3 against {', '.join(EAGLE3_TARGETS)} models only; "
                                    f"this target is {target.architecture} (vLLM stops at start: \"Eagle3 is only "
                                    "supported for ...\")", "use another drafter for this target", document, where))
        return refusals

    def size(self, target: ArtifactFacts, drafter: ArtifactFacts | None, request: Request,  # noqa: ARG002
             devices: tuple[DeviceBudget, ...]) -> Sizing:
        return size_vllm(target, request, devices)

    def device_memory_fraction(self, plan: ResolvedPlan) -> float:
        """What the plan charges its busiest device, as the share vLLM may take (rounded up to a hundredth): vLLM
        otherwise takes 90 % of every device whatever the plan, and a second engine on the device cannot start."""
        return max(math.ceil(100 * d.total_bytes / d.device_bytes) / 100 for d in plan.memory.devices)

    def launch(self, plan: ResolvedPlan, plan_path: Path, root: Path | None = None) -> Launch:  # noqa: ARG002
        flag = SETTINGS.flag
        rt = plan.runtime
        args: list[tuple[str, object]] = [
            (flag("alias"), plan.name), (flag("ctx"), rt.ctx), (flag("slots"), rt.slots), (flag("batch"), rt.batch),
            (flag("seed"), plan.sampling.seed),
            # the model's generation_config.json would override the plan's sampling
            (flag("generation_config"), "vllm"),
            (flag("gpu_memory_utilization"), f"{self.device_memory_fraction(plan):.2f}"),
            # vLLM converts a GGUF's tokenizer itself unless told otherwise; Power names the file it verified
            # (vLLM's GGUF guide: docs/features/quantization/gguf.md)
            (flag("tokenizer"), plan.target.path),
        ]
        notes = []
        if rt.kv_cache_type in KV_DTYPES:
            args.append((flag("kv_cache_type"), KV_DTYPES[rt.kv_cache_type]))
        else:
            notes.append(
                f"kv cache type {rt.kv_cache_type}: vLLM has no such --kv-cache-dtype; it uses the model dtype"
            )
        if plan.mode.chain:
            config, config_notes = speculative_config(plan)
            args.append((flag("speculative_config"), json.dumps(config, sort_keys=True)))
            notes += config_notes + unsupported_notes(plan)
        if rt.tensor_parallel > 1:
            args.append((flag("tensor_parallel"), rt.tensor_parallel))
        eager = ((flag("eager"),),) if not rt.cuda_graphs else ()
        return Launch(("vllm", "serve", plan.target.path), eager + options(args), visible_devices(plan), tuple(notes))


def speculative_config(plan: ResolvedPlan) -> tuple[dict, list[str]]:
    kind = plan.mode.chain[0]
    config: dict[str, object] = {"method": modes.vllm_method(kind), "num_speculative_tokens": plan.speculation.k}
    notes = []
    checkpoint = next((d for d in plan.drafters if d.kind == kind and d.files is not None), None)
    if checkpoint is not None:
        config["model"] = checkpoint.path  # the checkpoint folder `power verify` checked file by file
    if kind in modes.WEIGHT_FREE:
        rt = plan.runtime
        # vLLM's prompt lookup tries match lengths from max down to min: one length is llama.cpp's n-match.
        config |= {"prompt_lookup_min": rt.ngram_match, "prompt_lookup_max": rt.ngram_match,
                   "num_speculative_tokens": rt.ngram_draft_max}
        if rt.ngram_draft_min and rt.ngram_draft_min > 1:
            notes.append(f"n-gram shortest draft {rt.ngram_draft_min}: vLLM has no such setting; it proposes "
                         "shorter continuations too")
    return config, notes
