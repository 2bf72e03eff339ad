"""`power fleet report`: the fleet review as one self-contained HTML page (no scripts, no external assets).

The page is rendered from the review's JSON document (`fleet.review_document`)
through `templates/fleet_report.html.j2`: per host, one inline SVG bar per
device (each deployment's planned bytes, the headroom, what is free, and what
overflows the device), the deployments table, the findings, and the drift.
"""

from __future__ import annotations

from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from power.orchestrator.fleet.rollout import stage_states
from power.orchestrator.inputs.units import format_size

BAR_WIDTH = 640
DEPLOYMENT_COLOR = "#3b6fd8"
OVERFLOW_COLOR = "#b00020"
HEADROOM_COLOR = "#c9c9c9"
# A deployment the review could not plan: hatched across the bar, since what it would need is unknown.
NO_PLAN_COLOR = "url(#no-plan)"

_ENVIRONMENT = Environment(
    loader=PackageLoader("power.orchestrator", "templates"),
    autoescape=select_autoescape(["html", "j2"], default=True),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def render_report(document: dict[str, Any], drift_text: str, rollout: dict[str, Any] | None = None) -> str:
    """The HTML page for a review document, with the lock's rollout (`lock.rollout`) when there is one."""
    template = _ENVIRONMENT.get_template("fleet_report.html.j2")
    return template.render(
        review={**document, "drift_summary": document["summary"]["drift"]},
        hosts=[_host_view(host) for host in document["hosts"]],
        fleet_findings=[_finding_view(f) for f in document["findings"]],
        drift_text=drift_text,
        bar_width=BAR_WIDTH,
        rollout=_rollout_view(rollout) if rollout else None,
    )


def _rollout_view(rollout: dict[str, Any]) -> dict[str, Any]:
    return {
        "profile": rollout["profile"]["name"],
        "status": rollout["status"],
        "stages": [{"name": name, "state": state, "deployments": ", ".join(keys)} for name, state,
                   keys in stage_states(rollout)],
    }


def _host_view(host: dict[str, Any]) -> dict[str, Any]:
    findings = [f for d in host["deployments"] for f in d["findings"]]
    return {
        "name": host["name"],
        "labels": host["labels"],
        "devices": [_device_view(device, host["headroom_bytes"]) for device in host["devices"]],
        "deployments": [_deployment_view(d) for d in host["deployments"]],
        "findings": [_finding_view(f) for f in findings],
    }


def _device_view(device: dict[str, Any], headroom: int) -> dict[str, Any]:
    return {
        "index": device["index"],
        "model": device["model"],
        "vram": format_size(device["vram_bytes"]),
        "used": format_size(device["planned_bytes"]),
        "headroom": format_size(headroom),
        "segments": bar_segments(device["vram_bytes"], headroom, device["uses"]) + [
            _segment("no-plan", 0, BAR_WIDTH, NO_PLAN_COLOR, f"{key}: no plan (its findings say why)")
            for key in device.get("unplanned", [])],
        "unplanned": device.get("unplanned", []),
    }


def bar_segments(vram: int, headroom: int, uses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rectangles for one device bar, in pixels of BAR_WIDTH: deployments left to right, headroom at the right end.

    The scale is the larger of the device and what is planned on it, so an overflow shows as a red
    segment past the device's edge rather than being clipped.
    """
    planned = sum(use["bytes"] for use in uses)
    scale = BAR_WIDTH / max(vram, planned, 1)
    segments, x = [], 0.0
    for use in uses:
        width = use["bytes"] * scale
        segments.append(_segment("deployment", x, width, DEPLOYMENT_COLOR,
                                 f"{use['key']}: {format_size(use['bytes'])}"))
        x += width
    device_edge = vram * scale
    if planned > vram:
        segments.append(_segment("overflow", device_edge, x - device_edge, OVERFLOW_COLOR,
                                 f"over the device by {format_size(planned - vram)}"))
    segments.append(_segment("headroom", device_edge - headroom * scale, headroom * scale, HEADROOM_COLOR,
                             f"headroom {format_size(headroom)}"))
    return segments


def _segment(kind: str, x: float, width: float, color: str, label: str) -> dict[str, Any]:
    return {"kind": kind, "x": round(x, 1), "width": round(max(width, 0.0), 1), "color": color, "label": label}


def _deployment_view(item: dict[str, Any]) -> dict[str, Any]:
    margin = item["margin_bytes"]
    return {
        "key": item["key"],
        "device": item["device"],
        "verdict": item["verdict"],
        "margin": "" if margin is None else ("-" if margin < 0 else "") + format_size(abs(margin)),
        "mode": item["mode"] or "",
        "ks": "" if item["k"] is None else f"K{item['k']}/S{item['s']}",
        "rollback": item["rollback"] or "",
        "traffic": item["traffic"],
        "digest": (item["plan_digest"] or "")[:12],
    }


def _finding_view(finding: dict[str, Any]) -> dict[str, Any]:
    location = ":".join(str(part) for part in (finding["file"], finding["line"], finding["col"]) if part is not None)
    return {**finding, "location": location or "<fleet>"}
