"""Which device holds which layer: llama.cpp's layer split, reproduced with its float32 arithmetic.

`llama_model_base::load_tensors` (src/llama-model.cpp, llama.cpp 0c1e570):

- the split points are the tensor split ratios (all zero or unset: each
  device's free memory at load), summed cumulatively and divided by their sum,
  in float32;
- with n_layer_all blocks (the header's block_count, MTP blocks included) and
  `-ngl N` (`all`: n_layer_all + 1), `i_gpu_start = max(n_layer_all + 1 - N, 0)`
  and `act_gpu_layers = min(N, n_layer_all + 1)`; block il below i_gpu_start
  stays on the CPU, otherwise it goes to device
  `upper_bound(splits, float(il - i_gpu_start) / act_gpu_layers)`;
- the input layer (token_embd) is always on the CPU; the output layer counts as
  layer n_layer_all and is placed by the same rule (so `-ngl N` offloads the
  output layer and N - 1 blocks);
- `-sm none` keeps only the main GPU (src/llama.cpp, `llama_model_load`), so
  every offloaded layer lands there.

Each layer's KV cache and recurrent state live on that layer's device
(`llama_kv_cache`, `llama_memory_recurrent`: `model.dev_layer(il)` when offloading).
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass

from power.orchestrator.engines.sizing.model import DeviceBudget, Split, default_ratios

CPU = None  # a layer llama.cpp keeps in host memory


@dataclass(frozen=True)
class LayerPlacement:
    """Layer index -> position in the deployment's device list (None: host memory)."""

    layers: tuple[int | None, ...]
    output: int | None

    def layers_on(self, position: int | None) -> list[int]:
        return [il for il, where in enumerate(self.layers) if where == position]

    def describe(self, position: int) -> str:
        own = self.layers_on(position)
        runs = _runs(own)
        text = f"layers {runs}" if own else "no layers"
        return text + (" + output layer" if self.output == position else "")


def _runs(indices: list[int]) -> str:
    """[0, 1, 2, 5, 6] -> "0-2, 5-6"."""
    spans: list[list[int]] = []
    for index in indices:
        if spans and index == spans[-1][1] + 1:
            spans[-1][1] = index
        else:
            spans.append([index, index])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def place_layers(n_layer_all: int, gpu_layers: int | None, devices: tuple[DeviceBudget, ...],
                 split: Split) -> LayerPlacement:
    """The device of every block and of the output layer, as llama.cpp assigns them."""
    if len(devices) == 1 and devices[0].kind == "cpu":
        return LayerPlacement(tuple(0 for _ in range(n_layer_all)), 0)
    n_gpu = n_layer_all + 1 if gpu_layers is None else gpu_layers
    i_gpu_start = max(n_layer_all + 1 - n_gpu, 0)
    act_gpu_layers = min(n_gpu, n_layer_all + 1)
    if split.mode == "none":
        def device_of(il: int) -> int | None:
            return CPU if il < i_gpu_start or il - i_gpu_start >= act_gpu_layers else split.main
    else:
        points = _split_points(split.ratios or default_ratios(devices))

        def device_of(il: int) -> int | None:
            if il < i_gpu_start or il - i_gpu_start >= act_gpu_layers:
                return CPU
            value = _f32(_f32(il - i_gpu_start) / _f32(act_gpu_layers))
            return min(bisect.bisect_right(points, value), len(points) - 1)
    return LayerPlacement(tuple(device_of(il) for il in range(n_layer_all)), device_of(n_layer_all))


def _split_points(ratios: tuple[float, ...]) -> list[float]:
    """Cumulative ratios over their sum, in float32 as llama.cpp computes them."""
    total, sums = _f32(0.0), []
    for ratio in ratios:
        total = _f32(total + _f32(ratio))
        sums.append(total)
    return [_f32(s / total) for s in sums]


def _f32(value: float) -> float:
    """`value` rounded to the nearest float32. A sum or quotient of two float32 values taken in float64 and then
    rounded so is the float32 operation's own result (double rounding is innocuous when 53 >= 2 x 24 + 2 bits:
    Figueroa, "When is double rounding innocuous?", SIGNUM Newsletter 30(3), 1995)."""
    return struct.unpack("f", struct.pack("f", value))[0]
