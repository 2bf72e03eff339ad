"""CUDA graphs of a trunk's decode forwards: one per row count used, captured the first time it is used.

With real rows a decode forward has few shapes: 1 row (a plain round), K+1 (a
speculative round), the sums of several requests' rows (a batch). A graph is
captured per (rows, taps) on first use and replayed after that, which removes
the launch and Python cost of the forward's few hundred small kernels; prefill
chunks (any number of prompt rows) run eagerly.

A capture freezes every Python value the forward read. The forward's per-call
values therefore live in device buffers that the graph reads: the tokens, each
row's position and each row's slot (its sequence; -1 for a padding row). The
trunk's layers see them as a bare `DeviceRows` (`power.runtime.trunks.batch`),
which has no segments to read: the embedding gathers by the tokens, rope by the positions,
and the GPU path's cache write and attention kernels index the cache by slot and
position on the device (`power.kernels.attention`). A trunk whose layers need
the segments (a recurrent trunk's per-sequence state) cannot be captured, and
says so (`FixedShapeTrunk.capture_graphs`).

On each call the new values are copied into the graph's buffers, the graph is
replayed, and its outputs are copied out (the next replay overwrites them). The
first call of a shape runs the forward once eagerly on a side stream (Triton
compiles its kernels there, outside the capture; it writes the same cache rows
the replay then writes again, bit for bit), captures, and replays. The trunk's
graphs share one memory pool: their replays never overlap, and every output is
copied out before the next replay.

Fail closed: a capture that raises is a `CudaGraphError` (PWR607) naming the
shape and the fix; the run never goes on without the graph the plan asked for.
`Rerun` stands in for the capture off a GPU (the same forward again on the
buffers): it tests the buffer plumbing, not a graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch

from power.runtime.errors import RuntimeInputError

Outputs = tuple[torch.Tensor, dict[int, torch.Tensor]]  # final residual [m, d], taps {layer: [m, d]}
# (tokens, positions, slots) [rows] int64 each, taps -> the forward's outputs
Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Sequence[int]], Outputs]
GRAPHS_OFF = "set `cuda_graphs = false` in the profile's [runtime] and re-plan"


class CudaGraphError(RuntimeInputError):
    """The plan asks for CUDA graphs and this run cannot capture them: refused, never run without."""

    code = "PWR607"


class Recorder(Protocol):
    """Turns a forward over fixed buffers into its replay."""

    name: str

    def record(self, forward: Callable[[], Outputs]) -> Callable[[], Outputs]: ...


class CudaRecorder:
    """A CUDA graph per forward, all in one memory pool on `device`."""

    name = "cuda"

    def __init__(self, device: str) -> None:
        self.device = torch.device(device)
        self.pool = torch.cuda.graph_pool_handle()

    def record(self, forward: Callable[[], Outputs]) -> Callable[[], Outputs]:
        with torch.cuda.device(self.device):  # the capture, Triton's launches and the streams on the trunk's GPU
            stream = torch.cuda.current_stream()
            side = torch.cuda.Stream()
            side.wait_stream(stream)
            with torch.cuda.stream(side):
                forward()  # Triton compiles (and PyTorch initialises) outside the capture
            stream.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                outputs = forward()

        def replay() -> Outputs:
            graph.replay()
            return outputs

        return replay


class Rerun:
    """Off a GPU: the "replay" runs the forward again on the same buffers (tests the plumbing, captures nothing)."""

    name = "rerun"

    def record(self, forward: Callable[[], Outputs]) -> Callable[[], Outputs]:
        return forward


@dataclass(frozen=True)
class _Graph:
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # tokens, positions, slots: the buffers the graph reads
    replay: Callable[[], Outputs]


class ForwardGraphs:
    """A trunk's decode forward (`run`, reading nothing per call but its three input tensors) through one graph per
    (rows, taps)."""

    def __init__(self, run: Forward, recorder: Recorder) -> None:
        self._run, self.recorder = run, recorder
        self._graphs: dict[tuple[int, tuple[int, ...]], _Graph] = {}

    @property
    def captured(self) -> list[int]:
        """The row counts captured so far."""
        return sorted({rows for rows, _ in self._graphs})

    def run(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, taps: Sequence[int]) -> Outputs:
        """The forward of `tokens` at `positions` in `slots` ([rows] int64 each), through its graph."""
        key = (tokens.numel(), tuple(taps))
        graph = self._graphs.get(key) or self._capture(key, tokens, positions, slots)
        for buffer, value in zip(graph.inputs, (tokens, positions, slots), strict=True):
            buffer.copy_(value)
        final, tapped = graph.replay()
        return final.clone(), {layer: h.clone() for layer, h in tapped.items()}

    def _capture(self, key: tuple[int, tuple[int, ...]], *values: torch.Tensor) -> _Graph:
        tokens, positions, slots = (value.clone() for value in values)
        try:
            replay = self.recorder.record(lambda: self._run(tokens, positions, slots, key[1]))
        except Exception as error:  # any capture failure is a refusal, with what failed
            raise CudaGraphError(f"capturing the {key[0]}-row decode forward in a CUDA graph failed: "
                                 f"{type(error).__name__}: {error}", hint=GRAPHS_OFF) from error
        self._graphs[key] = graph = _Graph((tokens, positions, slots), replay)
        return graph
