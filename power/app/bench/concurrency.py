"""Speculation under load: `power bench --concurrency 1,4,8` drives each configuration with that many clients at once.

A speculative configuration's lead shrinks as the target's batch fills with
other requests' rows (the verification rows compete with them), and can turn
into a loss; a fleet serving eight slots cannot be gated on single-stream
evidence. Per level, shape and run, each configuration (alternating as the
single-stream protocol does) gets `level` identical requests at once: a live
server from `level` client threads (its slots decode them together), Power's
runtime through its own scheduler (`Engine.submit`, then `step` until all are
done). A level above the plan's slots is refused: the extra requests would
queue, and the figure would be the queue's.

Per level and shape the evidence carries the aggregate rate (every generated
token of the level's requests over the wall time from the first sent to the
last answered, the median over the runs) and the per-request medians (decode,
request-wide, time to first token); the candidate's speedup at each level is
its aggregate over the baseline's, and `stops_paying_at` is the first level
where it is under 1 + the noise band on some shape.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable

from power.documents.receipt import Receipt
from power.documents.verdicts import NOISE_BAND
from power.findings import PowerError
from power.runtime.engine import Engine


class ConcurrencyError(PowerError):
    """A --concurrency list that cannot run: not whole numbers, or a level above the plans' slots."""

    code = "PWR475"


def parse_levels(text: str, slots: int) -> list[int]:
    """`"1,4,8"` -> [1, 4, 8], each at most `slots` (the fewest any configuration's plan has)."""
    words = [word.strip() for word in text.split(",") if word.strip()]
    if not words or not all(word.isdigit() and int(word) >= 1 for word in words):
        raise ConcurrencyError(f"--concurrency {text!r}: write whole numbers >= 1, e.g. 1,4,8")
    levels = sorted({int(word) for word in words})
    if levels[-1] > slots:
        raise ConcurrencyError(f"--concurrency {levels[-1]}: the plans serve {slots} request(s) at once (their "
                               "slots); more clients would queue, and the figure would be the queue's",
                               hint=f"measure up to {slots}, or plan with more slots (runtime.parallel)")
    return levels


@dataclass(frozen=True)
class Level:
    """One configuration's `level` requests at once on one shape, in one run."""

    shape: str
    label: str
    run: int
    level: int
    wall_s: float
    receipts: list[Receipt]

    @property
    def aggregate_tok_s(self) -> float:
        return sum(len(r.token_ids) for r in self.receipts) / self.wall_s if self.wall_s > 0 else 0.0


def at_once(engine: Any, prompt: str, max_tokens: int, sampling: Any, level: int) -> tuple[float, list[Receipt]]:
    """`level` identical requests at once; the wall time from the first sent to the last answered, and receipts."""
    started = time.perf_counter()
    if isinstance(engine, Engine):  # Power's runtime: its own scheduler decodes the requests together
        ids = engine.encode(prompt, max_tokens)
        tickets = [engine.submit(ids, max_tokens, sampling=sampling) for _ in range(level)]
        while not all(ticket.done for ticket in tickets):
            engine.step()
        receipts = [ticket.result() for ticket in tickets]
    else:  # a live server: one client thread per request
        with ThreadPoolExecutor(level) as pool:
            receipts = list(pool.map(lambda _: engine.generate(prompt, max_tokens, sampling=sampling), range(level)))
    return time.perf_counter() - started, receipts


def measure(config: Any, shape: Any, run: int, level: int) -> Level:
    sampling = replace(config.engine.sampling, temperature=shape.temperature)
    wall_s, receipts = at_once(config.engine, shape.prompt_for(run), shape.max_tokens, sampling, level)
    return Level(shape.name, config.label, run, level, wall_s, receipts)


def summary(levels: list[Level]) -> dict[str, Any]:
    """One configuration's figures at one level on one shape, over the runs."""
    rates = [m.aggregate_tok_s for m in levels]
    receipts = [r for m in levels for r in m.receipts]
    return {"runs": len(levels), "aggregate_tok_s": statistics.median(rates), "aggregate_tok_s_min": min(rates),
            "aggregate_tok_s_max": max(rates),
            "per_request_decode_tok_s": statistics.median(r.decode_tok_s for r in receipts),
            "per_request_request_tok_s": statistics.median(r.request_tok_s for r in receipts),
            "per_request_ttft_s": statistics.median(r.ttft_s for r in receipts),
            "draft_n": sum(r.proposed for r in receipts), "draft_n_accepted": sum(r.accepted for r in receipts)}


def section(measured: list[Level], roles: dict[str, str], levels: list[int], shapes: list[str],
            slots: int) -> dict[str, Any]:
    """The evidence's `concurrency`: per level and shape each role's summary and the candidate's speedup, and the
    first level where it stops paying."""
    per_level: dict[str, Any] = {}
    stops = None
    for level in levels:
        by_shape = {}
        for shape in shapes:
            result: dict[str, Any] = {role: summary([m for m in measured if m.level == level and m.shape == shape
                                                     and m.label == label]) for label, role in roles.items()}
            if "baseline" in result and result["baseline"]["aggregate_tok_s"] > 0:
                result["speedup"] = result["candidate"]["aggregate_tok_s"] / result["baseline"]["aggregate_tok_s"]
                if stops is None and result["speedup"] < 1 + NOISE_BAND:
                    stops = level
            by_shape[shape] = result
        per_level[str(level)] = by_shape
    compared = "baseline" in roles.values()
    reason = ("no baseline to compare with" if not compared
              else f"the candidate's aggregate is under {1 + NOISE_BAND:.2f}x the baseline's from {stops} clients"
              if stops is not None else f"the candidate pays at every level measured (up to {levels[-1]})")
    return {"levels": levels, "slots": slots, "per_level": per_level,
            "stops_paying_at": stops if compared else None, "reason": reason}


def run_levels(configs: list[Any], shapes: list[Any], runs: int, levels: list[int],
               progress: Callable[[str], None]) -> list[Level]:
    """Side by side: per level, shape and run, each configuration in turn, the order swapping every run."""
    return [_measured(config, shape, run, level, progress)
            for level in levels for shape in shapes for run in range(runs)
            for config in (configs if run % 2 == 0 else configs[::-1])]


def in_turn(config: Any, run: int, shapes: list[Any], levels: list[int],
            progress: Callable[[str], None]) -> list[Level]:
    """One at a time: the levels of one configuration's turn, after its single-stream requests."""
    return [_measured(config, shape, run, level, progress) for level in levels for shape in shapes]


def _measured(config: Any, shape: Any, run: int, level: int, progress: Callable[[str], None]) -> Level:
    measured = measure(config, shape, run, level)
    progress(f"{shape.name} run {run + 1} {config.label} x{level}: {measured.aggregate_tok_s:.2f} tok/s aggregate")
    return measured
