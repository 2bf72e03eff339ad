"""PWR507, PWR508, PWR510, PWR530, PWR532: the profile's split settings against the deployment's
devices, whatever the engine.

Located at the profile key an operator changes (runtime.tensor_split,
runtime.main_gpu); any error means no plan. What one engine cannot run on the
devices (several for Power's runtime, tensor parallelism for the others, heads
that do not shard) is its adapter's (`power.orchestrator.engines`).
"""

from __future__ import annotations

from power.findings import Finding
from power.orchestrator.inputs.loading import Loaded
from power.orchestrator.inputs.rules import override_target
from power.orchestrator.inputs.schema import HostSpec


def check_devices(profile: Loaded, host: HostSpec, devices: tuple[int, ...]) -> list[Finding]:
    runtime = profile.model.runtime
    count = len(devices)
    kinds = {host.devices[index].kind for index in devices}
    findings = []
    if "cpu" in kinds and count > 1:
        findings.append(profile.finding(
            "PWR510", f"devices {list(devices)} of host {host.name} mix a cpu device with others: a cpu device runs "
            "the whole model on its own", where="runtime", hint="give the deployment either one cpu device or GPUs"))
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
    draft = runtime.draft_device
    if draft is not None and (draft >= count or host.devices[devices[draft]].kind != "gpu"):
        gpus = [position for position, index in enumerate(devices) if host.devices[index].kind == "gpu"]
        findings.append(profile.finding(
            "PWR530", f"runtime.draft_device = {draft}, but the deployment's GPUs are at "
            f"{gpus or 'no position'} of its {count} device(s) (draft_device counts within them, from 0)",
            where="runtime.draft_device",
            hint=f"use a draft_device among {gpus}" if gpus else "remove draft_device: the drafter runs where the "
                                                                  "target runs"))
    for index, entry in enumerate(runtime.draft_override_tensor or ()):
        target = override_target(entry)
        if target is not None and target[1] is not None and (target[1] >= count
                                                             or host.devices[devices[target[1]]].kind != "gpu"):
            findings.append(profile.finding(
                "PWR532", f"runtime.draft_override_tensor[{index}] = {entry!r} names CUDA{target[1]}, but the "
                f"deployment has {count} device(s) (CUDA<n> counts within them, from 0)",
                where=f"runtime.draft_override_tensor[{index}]", hint="name one of the deployment's GPUs, or CPU"))
    return findings
