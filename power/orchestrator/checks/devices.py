"""PWR507-511: the profile's split settings against the deployment's devices, the engine and the model's heads.

Located at the profile key an operator changes (runtime.tensor_split,
runtime.main_gpu, runtime.tensor_parallel, runtime.kv_cache_type); any error
means no plan.
"""

from __future__ import annotations

from power.artifacts.facts import ArtifactFacts
from power.findings import Finding
from power.orchestrator.loading import Loaded
from power.orchestrator.schema import HostSpec
from power.orchestrator.sizing import tensor_parallel_issue
from power.orchestrator.sizing.model import is_quantized


def check_devices(profile: Loaded, host: HostSpec, devices: tuple[int, ...], engine: str,
                  target: ArtifactFacts) -> list[Finding]:
    runtime = profile.model.runtime
    count = len(devices)
    kinds = {host.devices[index].kind for index in devices}
    findings = []
    if "cpu" in kinds and count > 1:
        findings.append(profile.finding(
            "PWR510", f"devices {list(devices)} of host {host.name} mix a cpu device with others: a cpu device runs "
            "the whole model on its own", where="runtime", hint="give the deployment either one cpu device or GPUs"))
    if engine == "power" and count > 1:
        findings.append(profile.finding(
            "PWR510", f"Power's runtime runs on one device; this deployment names {count}", where="runtime",
            hint='run it with engine "llama-server" (a layer split) or "vllm" (tensor parallelism), or use one device'))
    if runtime.tensor_split is not None and len(runtime.tensor_split) != count:
        findings.append(profile.finding(
            "PWR507", f"runtime.tensor_split has {len(runtime.tensor_split)} ratio(s) for {count} device(s) "
            f"({', '.join(host.devices[i].model for i in devices)})", where="runtime.tensor_split",
            hint=f"give one ratio per device, e.g. tensor_split = [{', '.join(['1'] * count)}]"))
    if runtime.main_gpu >= count:
        findings.append(profile.finding(
            "PWR508", f"runtime.main_gpu = {runtime.main_gpu}, but the deployment has {count} device(s) "
            f"(main_gpu counts within them, from 0)", where="runtime.main_gpu",
            hint=f"use a main_gpu from 0 to {count - 1}"))
    tp = runtime.tensor_parallel
    if engine == "vllm" and tp != count:
        findings.append(profile.finding(
            "PWR510", f"runtime.tensor_parallel = {tp}, but the deployment runs on {count} device(s): vLLM shards "
            "each layer over exactly the devices it is given", where="runtime.tensor_parallel",
            hint=f"set tensor_parallel = {count}, or give the deployment {tp} device(s)"))
    if engine != "vllm" and tp > 1:
        findings.append(profile.finding(
            "PWR510", f"runtime.tensor_parallel = {tp} is vLLM's setting; {engine} does not shard layers",
            where="runtime.tensor_parallel",
            hint="remove tensor_parallel (llama-server splits layers by runtime.tensor_split), or run engine \"vllm\""))
    issue = tensor_parallel_issue(target, tp) if engine == "vllm" else None
    if issue:
        findings.append(profile.finding("PWR509", issue, where="runtime.tensor_parallel",
                                        hint="use a tensor_parallel that divides the heads (1, 2, 4, ...)"))
    if engine == "llama-server" and is_quantized(runtime.kv_cache_type) and not runtime.flash_attn:
        findings.append(profile.finding(
            "PWR511", f"kv_cache_type = \"{runtime.kv_cache_type}\" quantizes the V cache, which llama-server only "
            "runs with flash attention (it stops at start: \"quantized V cache was requested, but this requires "
            "Flash Attention\")", where="runtime.kv_cache_type",
            hint="set flash_attn = true, or kv_cache_type = \"f16\""))
    return findings
