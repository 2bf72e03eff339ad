"""Issue 38: a NaN or Inf weight or block scale made every logit NaN and greedy decoding token 0 forever, silently;
the runtime now refuses such a file as it reads the tensor into place (PWR126), naming the tensor and the byte."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from gguf_helpers import fixtures

from power.app.cli import main
from power.artifacts.gguf_reader import read_header
from power.kernels.blocks import SCALE_FIELDS, random_blocks
from power.kernels.dequant import BLOCK_LAYOUT
from power.runtime.finite_weights import FLOAT_TYPES, first_non_finite

NOT_FINITE = {"F32": np.float32, "F16": np.float16}


def run(gguf) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["run", "--gguf", str(gguf), "--prompt", "The", "--max-tokens", "3", "--json"])
    assert "Traceback" not in result.output, result.output
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.parametrize("name, at", [("token_embd.weight", 2 * 7), ("output_norm.weight", 4 * 3),
                                      ("output.weight", 34 * 5), ("blk.0.attn_q.weight", 18 * 2)])
def test_power_run_refuses_a_model_with_a_nan_weight_or_scale(tmp_path, name, at):
    """One NaN in a float tensor (F16, F32) or in one block's float16 scale (Q8_0, Q4_0) of a built fixture: `power
    run` refuses the file with PWR126 at that byte; the same file with that value restored runs."""
    source = fixtures()["dense-target"]
    tensor = next(t for t in read_header(source).tensors if t.name == name)
    offset = read_header(source).data_offset + tensor.offset + at
    clean = source.read_bytes()
    poisoned = tmp_path / "dense-target.gguf"
    value = NOT_FINITE.get(tensor.type_name, np.float16)("nan").tobytes()
    poisoned.write_bytes(clean[:offset] + value + clean[offset + len(value):])

    code, refused = run(poisoned)
    finding, = refused["findings"]
    assert code == 2 and finding["code"] == "PWR126", refused
    assert name in finding["message"] and finding["offset"] == offset and "re-download" in finding["hint"]

    poisoned.write_bytes(clean)
    code, ran = run(poisoned)
    assert code == 0 and not ran.get("findings"), ran


@pytest.mark.parametrize("qtype", list(BLOCK_LAYOUT))
@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_every_runtime_type_is_judged_by_its_weights_or_block_scales(qtype, bad):
    """Each type the runtime dequantises: finite data passes, and a non-finite weight or scale (each scale field of
    a K-quant block) is found at its byte; the quants themselves are never mistaken for floats."""
    if qtype in FLOAT_TYPES:
        weights = torch.randn(64 * 32).to(FLOAT_TYPES[qtype])
        raw, places = weights.view(torch.uint8), [(5 * weights.element_size(), weights.dtype)]
    else:
        raw = random_blocks(qtype, 4, 1024, seed=3).flatten()
        block_bytes = BLOCK_LAYOUT[qtype][1]
        places = [(3 * block_bytes + field, torch.float16) for field in SCALE_FIELDS[qtype]]
    assert first_non_finite(qtype, raw) is None
    for byte, dtype in places:
        poisoned = raw.clone()
        width = torch.finfo(dtype).bits // 8
        poisoned[byte:byte + width] = torch.tensor([float(bad)], dtype=dtype).view(torch.uint8)
        assert first_non_finite(qtype, poisoned) == byte
