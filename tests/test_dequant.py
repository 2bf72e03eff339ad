"""The torch dequantisation references against gguf.quants, and how the weight loader reports bad tensors."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from gguf_helpers import gemma

from power.artifacts.gguf_reader import ArtifactError
from power.kernels.dequant import BLOCK_LAYOUT, REFERENCES, UnsupportedQuantType, dequantize_reference
from power.runtime.gguf_weights import GGUFFile
from power.runtime.trunks import load_trunk

pytestmark = pytest.mark.slow  # outside `scripts/test --fast`: interpreter-heavy or runs the real model for long


def assert_same_bits(actual: torch.Tensor, expected: np.ndarray) -> None:
    """Bit patterns equal; NaNs (random bytes make some) only need to sit in the same places."""
    actual_np = actual.numpy().astype(np.float32).reshape(-1)
    expected = np.asarray(expected, dtype=np.float32).reshape(-1)
    nan = np.isnan(expected)
    assert np.array_equal(np.isnan(actual_np), nan)
    assert np.array_equal(actual_np[~nan].view(np.int32), expected[~nan].view(np.int32))


@pytest.mark.parametrize("qtype", sorted(REFERENCES))
def test_random_bytes_dequantise_like_gguf_quants(qtype):
    per_block, block_bytes = BLOCK_LAYOUT[qtype]
    n_blocks = 96
    raw = np.random.default_rng(len(qtype) * 7).integers(0, 256, n_blocks * block_bytes, dtype=np.uint8)
    with np.errstate(invalid="ignore", over="ignore"):
        expected = gguf_dequantize(raw, gguf.GGMLQuantizationType[qtype])
    actual = dequantize_reference(qtype, torch.from_numpy(raw.copy()), (n_blocks, per_block))
    assert actual.shape == (n_blocks, per_block) and actual.dtype == torch.float32
    assert_same_bits(actual, expected)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q5_0", "Q8_0"])
def test_quantised_weights_round_trip_like_gguf_quants(qtype):
    weights = np.random.default_rng(1).normal(0, 0.02, (16, 256)).astype(np.float32)
    raw = gguf_quantize(weights, gguf.GGMLQuantizationType[qtype]).reshape(-1)
    actual = dequantize_reference(qtype, torch.from_numpy(raw.copy()), weights.shape)
    assert_same_bits(actual, gguf_dequantize(raw, gguf.GGMLQuantizationType[qtype]))
    assert float((actual - torch.from_numpy(weights)).abs().max()) < 0.01  # and it is close to the original


def test_every_tensor_type_of_the_real_gemma_layer_zero_matches_gguf_quants():
    model = GGUFFile(gemma())
    names = [name for name in model.tensors if name.startswith("blk.0.")]
    assert {model.info(n).qtype for n in names} == {"F32", "Q5_0", "Q8_0", "Q4_K", "Q6_K"}
    for name in names:
        info = model.info(name)
        expected = gguf_dequantize(model.raw(name).numpy(), gguf.GGMLQuantizationType[info.qtype])
        actual = model.tensor(name, info.shape)
        assert actual.shape == info.shape
        assert_same_bits(actual, expected)


def test_a_type_without_a_dequantiser_is_named():
    with pytest.raises(UnsupportedQuantType, match="Q4_1.*supported: F32"):
        dequantize_reference("Q4_1", torch.zeros(20, dtype=torch.uint8), (32,))


def _write(path: Path, architecture: str, tensors: dict[str, tuple[np.ndarray, gguf.GGMLQuantizationType]]) -> Path:
    writer = gguf.GGUFWriter(str(path), architecture)
    for name, (values, qtype) in tensors.items():
        data = values if qtype == gguf.GGMLQuantizationType.F32 else gguf_quantize(values, qtype)
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_loader_names_a_missing_tensor_a_wrong_shape_and_an_unsupported_type(tmp_path):
    values = np.ones((4, 32), dtype=np.float32)
    path = _write(tmp_path / "odd.gguf", "llama", {
        "plain.weight": (values, gguf.GGMLQuantizationType.F32),
        "q41.weight": (values, gguf.GGMLQuantizationType.Q4_1),
    })
    model = GGUFFile(path)
    assert torch.equal(model.tensor("plain.weight", (4, 32)), torch.ones(4, 32))
    with pytest.raises(ArtifactError, match=r"odd\.gguf: PWR121 \[error\] tensor 'absent\.weight' is missing"):
        model.tensor("absent.weight")
    with pytest.raises(ArtifactError, match=r"'plain\.weight' has shape \[4, 32\], expected \[32, 4\]"):
        model.tensor("plain.weight", (32, 4))
    with pytest.raises(ArtifactError, match=r"'q41\.weight' is Q4_1, which the runtime cannot dequantise"):
        model.tensor("q41.weight")


def test_an_unimplemented_architecture_is_refused_by_name(tmp_path):
    path = _write(tmp_path / "mamba.gguf", "mamba", {"x.weight": (np.ones(32, dtype=np.float32),
                                                                  gguf.GGMLQuantizationType.F32)})
    with pytest.raises(ArtifactError, match=r"mamba\.gguf: PWR120 \[error\] architecture 'mamba' is "
                                            r"not implemented.*gemma3"):
        load_trunk(path, n_ctx=16, verify_capacity=1)


def test_a_file_that_is_not_gguf_is_an_artifact_error(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_bytes(b"not a model at all, just text" * 4)
    with pytest.raises(ArtifactError, match="notes.gguf"):
        GGUFFile(path)
