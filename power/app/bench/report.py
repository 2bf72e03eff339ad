"""Bench reports: the per-shape table (terminal text, Markdown, HTML) and an inline SVG chart per shape.

Everything is rendered from the evidence document alone, so a report can be
re-rendered from any saved `power.evidence/v1` file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from power.artifacts.atomic import write_text_atomic

REPORT_FORMATS = {".md": "bench_report.md.j2", ".html": "bench_report.html.j2"}
CHART_WIDTH, BAR_HEIGHT, LABEL_WIDTH = 520, 22, 90
TARGET_ONLY_FLOOR = 0.98  # the cost governor's promise (docs/speculation.md)
BELOW_TARGET_ONLY_FIX = ("gate its speculator off for this traffic (plan it with profiles/target-only.toml, "
                         "or raise the profile's spec_draft_p_min) or retrain its drafter (power drafter "
                         "distill, a larger --budget)")
COLUMNS = ("shape", "candidate tok/s", "baseline tok/s", "speedup", "request-wide candidate", "request-wide baseline",
           "request-wide speedup", "TTFT s (cand./base.)", "acceptance", "by draft position", "mean acc. len",
           "replays/fallbacks", "parity", "verdict")


def configs(evidence: dict[str, Any]) -> list[str]:
    return [label for label in ("candidate", "baseline") if evidence.get(label)]


def rows(evidence: dict[str, Any]) -> list[dict[str, str]]:
    """One row of display strings per shape, in the order the shapes ran."""
    table = []
    for name, result in evidence["shapes"].items():
        candidate = result["candidate"]
        baseline = result.get("baseline")
        table.append(
            {
                "shape": name,
                "candidate tok/s": _rate(candidate),
                "baseline tok/s": _rate(baseline) if baseline else "-",
                "speedup": f"{result['speedup']:.2f}x" if result.get("speedup") else "-",
                "request-wide candidate": _rate(candidate, "request_tok_s"),
                "request-wide baseline": _rate(baseline, "request_tok_s") if baseline else "-",
                "request-wide speedup": f"{result['request_speedup']:.2f}x" if result.get("request_speedup") else "-",
                "TTFT s (cand./base.)": f"{candidate['ttft_s']:.3f}"
                + (f"/{baseline['ttft_s']:.3f}" if baseline else ""),
                "acceptance": f"{candidate['acceptance']:.1%}" if candidate["draft_n"] else "no drafts",
                "by draft position": " ".join(f"{p:.2f}" for p in candidate.get("acceptance_by_position", [])) or "-",
                "mean acc. len": f"{candidate['mean_accepted_length']:.2f}",
                "replays/fallbacks": f"{candidate['replays']}/{candidate['fallbacks']}",
                "parity": "identical"
                if result["parity"]
                else "near-tie"
                if result.get("exactness") == "near-tie"
                else "DIFFERENT",
                "verdict": result["verdict"],
            }
        )
    return table


def _rate(summary: dict[str, Any], key: str = "decode_tok_s") -> str:
    return f"{summary[key]:.2f} [{summary[f'{key}_min']:.2f}-{summary[f'{key}_max']:.2f}]"


def text_table(evidence: dict[str, Any]) -> str:
    """The per-shape table for a terminal, then the losslessness and negative-control lines."""
    table = rows(evidence)
    widths = {c: max(len(c), *(len(r[c]) for r in table)) for c in COLUMNS}
    lines = ["  ".join(c.ljust(widths[c]) for c in COLUMNS)]
    lines += ["  ".join(r[c].ljust(widths[c]) for c in COLUMNS) for r in table]
    return "\n".join(lines + [""] + summary_lines(evidence)) + "\n"


def _control_state(control: dict[str, Any]) -> str:
    """Whether the zero-draft control holds; "none" when both plans speculate by design (nothing to hold), "does not
    hold" only when a side that should have drafted nothing, or something, did not."""
    if control["holds"]:
        return "holds"
    return "none (both plans draft)" if min(control["draft_n"].values()) > 0 else "does not hold"


def summary_lines(evidence: dict[str, Any]) -> list[str]:
    lossless = evidence["lossless"]
    lines = [f"losslessness: {'PROVEN' if lossless['proven'] else 'NOT PROVEN'} - {lossless['reason']}"]
    if lossless.get("near_tie_shapes"):
        lines.append(f"exactness: {lossless['exactness']} - near-ties only on {', '.join(lossless['near_tie_shapes'])}"
                     f"{' (proven but for them)' if lossless.get('proven_to_near_ties') else ''}")
    control = evidence.get("negative_control")
    if control:
        lines.append(f"negative control: {_control_state(control)} - {control['reason']}")
    host = evidence.get("host")
    if host:
        lines.append(f"host: {'BUSY' if host['busy'] else 'quiet'} - {host['reason']}")
    protocol = evidence["protocol"]
    if protocol.get("residency_reason"):
        lines.append(f"residency: {protocol['residency']} - {protocol['residency_reason']}")
    return lines + paired_speedups(evidence) + below_target_only(evidence)


def paired_speedups(evidence: dict[str, Any]) -> list[str]:
    """The line that says how the speedups were taken: not the ratio of the medians each row shows."""
    if not any(result.get("speedup") for result in evidence["shapes"].values()):
        return []
    return ["speedup: the median of the paired runs' ratios (run r sent the same request to both configurations, one "
            "right after the other), not the ratio of the median tok/s beside it"]


def below_target_only(evidence: dict[str, Any]) -> list[str]:
    """A line per shape and speculative configuration that decodes below target-only, naming its plan, the ratio and
    the fix: a median decode rate under the governor's promise (docs/speculation.md), 0.98x the target's own rate
    measured inside the same engine; and, against a `--vs` baseline that is target-only, a median paired ratio under
    0.98x."""
    lines = []
    baseline: dict[str, Any] = evidence.get("baseline") or {}
    candidate = evidence["candidate"]
    versus_target_only = baseline.get("mode") == "none" and candidate.get("mode") != "none"
    for name, result in evidence["shapes"].items():
        for label in configs(evidence):
            summary = result.get(label)
            plain = summary and summary.get("target_only_tok_s")
            if plain and summary["decode_tok_s"] < TARGET_ONLY_FLOOR * plain:
                lines.append(f"below target-only: the {label} {evidence[label]['plan']} on {name} decodes at "
                             f"{summary['decode_tok_s'] / plain:.2f}x the target's own rate in the same engine "
                             f"({summary['decode_tok_s']:.2f} against {plain:.2f} tok/s, the cost governor's plain "
                             f"rounds): its speculation costs more than it lands here; {BELOW_TARGET_ONLY_FIX}")
        speedup = result.get("speedup")
        if versus_target_only and speedup is not None and speedup < TARGET_ONLY_FLOOR:
            lines.append(f"below target-only: the candidate {candidate['plan']} on {name} decodes at {speedup:.2f}x "
                         f"the target-only baseline {baseline['plan']} (the median of the paired runs' ratios); "
                         f"{BELOW_TARGET_ONLY_FIX}")
    return lines


def chart(result: dict[str, Any], labels: list[str]) -> dict[str, Any]:
    """SVG geometry for one shape: a bar at each configuration's median decode tok/s, a whisker over min-max."""
    top = max(result[label]["decode_tok_s_max"] for label in labels) or 1.0
    scale = (CHART_WIDTH - LABEL_WIDTH - 70) / top
    bars = []
    for i, label in enumerate(labels):
        s = result[label]
        y = 10 + i * (BAR_HEIGHT + 10)
        bars.append({"label": label, "y": y, "mid": y + BAR_HEIGHT / 2, "width": s["decode_tok_s"] * scale,
                     "low": LABEL_WIDTH + s["decode_tok_s_min"] * scale,
                     "high": LABEL_WIDTH + s["decode_tok_s_max"] * scale,
                     "value": f"{s['decode_tok_s']:.2f} tok/s"})
    return {"width": CHART_WIDTH, "height": 20 + len(labels) * (BAR_HEIGHT + 10), "x0": LABEL_WIDTH,
            "bar_height": BAR_HEIGHT, "bars": bars}


def render(evidence: dict[str, Any], template: str) -> str:
    environment = Environment(loader=PackageLoader("power.app.bench", "templates"), undefined=StrictUndefined,
                              autoescape=select_autoescape(["html.j2"]), trim_blocks=True, lstrip_blocks=True)
    labels = configs(evidence)
    charts = {name: chart(result, labels) for name, result in evidence["shapes"].items()}
    return environment.get_template(template).render(
        evidence=evidence, columns=COLUMNS, rows=rows(evidence), charts=charts, summary=summary_lines(evidence))


def write_report(evidence: dict[str, Any], path: Path) -> None:
    """Markdown for `.md`, a self-contained HTML page for `.html` (atomically written)."""
    path = Path(path)
    if path.suffix not in REPORT_FORMATS:
        raise ValueError(f"{path}: a report is .md or .html, not {path.suffix or 'a file without a suffix'!r}")
    write_text_atomic(path, render(evidence, REPORT_FORMATS[path.suffix]))
