"""The CPU products with GGUF matrices kept in their blocks (power.kernels.cpu).

Every instruction path this CPU has is built (the first build of a path takes tens of seconds; it is cached
outside the checkout) and compared bit for bit with the torch reference, on random blocks and on real tensors
of the bundled Gemma 3 270M; a row's result must not depend on the number of rows in the call.
"""

from __future__ import annotations

import os
import subprocess
import sys

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from gguf_helpers import gemma
from kernel_helpers import random_blocks

from power.kernels.cpu import CPUPathError, QuantMatrix, available_paths, chosen_path, reference_matmul
from power.kernels.cpu.build import build_key
from power.kernels.dequant import dequantize_reference
from power.runtime.gguf_weights import GGUFFile

PATHS = available_paths()
QUANT_TYPES = ("Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q5_K", "Q6_K")
FLOAT_TYPES = ("F32", "F16", "BF16")
GGUF_QUANTISABLE = ("Q8_0", "Q4_0", "Q5_0")  # the types gguf.quants can quantise (it only dequantises K-quants)
# The flags line of an AVX2-only CPU (an Intel Core of the Haswell generation), as /proc/cpuinfo writes it.
AVX2_ONLY = frozenset("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr "
                      "sse sse2 ss ht syscall nx pdpe1gb rdtscp lm constant_tsc pni pclmulqdq ssse3 fma cx16 "
                      "sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand lahf_lm abm bmi1 avx2 bmi2 erms".split())
# An AVX-512 VNNI CPU without AMX (an Intel Xeon of the Ice Lake generation), and one with AMX (Sapphire Rapids).
AVX512_VNNI = AVX2_ONLY | {"avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"}
AMX = AVX512_VNNI | {"amx_bf16", "amx_tile", "amx_int8"}
OUT, IN = 40, 512  # 40 rows: two whole tiles of 16 and a padded one


def float_raw(qtype: str, weights: np.ndarray) -> torch.Tensor:
    if qtype == "BF16":
        return torch.from_numpy(weights).to(torch.bfloat16).view(torch.uint8).reshape(-1)
    dtype = np.float16 if qtype == "F16" else np.float32
    return torch.from_numpy(weights.astype(dtype).view(np.uint8).reshape(-1).copy())


def matrix_bytes(qtype: str, seed: int, out: int = OUT, gaussian: bool = False) -> torch.Tensor:
    """Flat GGUF bytes of an [out, IN] matrix: gguf-quantised normals, or random blocks (every bit pattern)."""
    weights = np.random.default_rng(seed).standard_normal((out, IN)).astype(np.float32)
    if qtype in FLOAT_TYPES:
        return float_raw(qtype, weights)
    if gaussian:
        return torch.from_numpy(gguf_quantize(weights, gguf.GGMLQuantizationType[qtype]).reshape(-1).copy())
    return random_blocks(qtype, out, IN, seed).reshape(-1).contiguous()


def exact_weights(qtype: str, raw: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    if qtype == "BF16":
        return raw.view(torch.bfloat16).to(torch.float64).reshape(shape)
    values = gguf_dequantize(raw.numpy(), gguf.GGMLQuantizationType[qtype])
    return torch.from_numpy(values.astype(np.float64)).reshape(shape)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("qtype", QUANT_TYPES + FLOAT_TYPES)
def test_every_type_on_every_path_equals_the_reference(qtype, path):
    torch.manual_seed(0)
    x = torch.randn(5, IN) * torch.rand(1, IN) * 4  # channels of different scales, as in a residual stream
    # Random blocks hold every bit pattern (Q8_0's -128, the largest 6-bit scales); gguf.quants makes real ones.
    matrices = [matrix_bytes(qtype, 1)] + ([matrix_bytes(qtype, 2, gaussian=True)] if qtype in GGUF_QUANTISABLE else [])
    for raw in matrices:
        matrix = QuantMatrix(qtype, raw, (OUT, IN), path=path)
        assert matrix.path == path
        assert torch.equal(matrix(x), reference_matmul(qtype, raw, (OUT, IN), x))


GEMMA_TENSORS = ("token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.0.attn_output.weight",
                 "blk.0.ffn_down.weight", "blk.3.ffn_gate.weight")


@pytest.mark.parametrize("path", PATHS)
def test_real_gemma_tensors_equal_the_reference(path):
    model = GGUFFile(gemma())
    torch.manual_seed(1)
    seen = set()
    for name in GEMMA_TENSORS:
        info = model.info(name)
        rows, width = 48, info.shape[1]
        raw = model.raw(name)[:rows * info.nbytes // info.shape[0]]  # the first 48 output rows
        x = torch.randn(3, width)
        matrix = QuantMatrix(info.qtype, raw, (rows, width), path=path)
        assert torch.equal(matrix(x), reference_matmul(info.qtype, raw, (rows, width), x)), name
        seen.add(info.qtype)
    assert seen == {"Q8_0", "Q5_0", "Q4_K", "Q6_K"}  # every matrix type of the bundled model


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("qtype", QUANT_TYPES + FLOAT_TYPES)
def test_a_row_is_the_same_bits_at_every_row_count(qtype, path):
    matrix = QuantMatrix(qtype, matrix_bytes(qtype, 3), (OUT, IN), path=path)
    torch.manual_seed(2)
    x = torch.randn(17, IN)  # 17: one past the kernels' 16 rows a pass
    alone = torch.cat([matrix(x[i:i + 1]) for i in range(17)])
    for n in range(1, 18):
        assert torch.equal(matrix(x[:n]), alone[:n]), n
    rows = torch.tensor([39, 0, 17, 17, 31, 5])  # unsorted, repeated, in three tiles
    assert torch.equal(matrix.select(x, rows), alone[:, rows])


# 63 tiles, the last half padding, large enough for the amx path's tile kernels; 33 blocks of 32 (the tile kernels
# take them four at a time) or 5 of 256.
TILE_OUT = 1000
TILE_IN = {"Q8_0": 1056, "Q4_0": 1056, "Q5_0": 1056, "Q4_K": 1280, "Q5_K": 1280, "Q6_K": 1280}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("qtype", QUANT_TYPES)
def test_a_matrix_large_enough_for_tile_products_equals_the_reference_at_every_row_count(qtype, path):
    """The amx path multiplies a call with tiles once it has a few rows and enough weight bytes times rows
    (csrc/qmatmul.cpp, `takes_amx`: from 3 to 8 rows by type for this matrix), in passes of 16 rows; below, with
    the avx512vnni kernels. Either way the bits are the reference's, at 1 and 3 threads."""
    shape = (TILE_OUT, TILE_IN[qtype])
    raw = random_blocks(qtype, *shape, 10).reshape(-1).contiguous()
    matrix = QuantMatrix(qtype, raw, shape, path=path)
    torch.manual_seed(4)
    x = torch.randn(33, shape[1]) * torch.rand(1, shape[1]) * 4
    expected = reference_matmul(qtype, raw, shape, x)
    for n in [*range(1, 18), 32, 33]:  # 17 and 33: a pass of one row after whole passes of 16
        assert torch.equal(matrix(x[:n]), expected[:n]), n
    rows = torch.tensor([999, 0, 517, 517, 992, 15, 16, *range(40, 999, 61)])  # unsorted, repeated, the padded tile
    for n in (5, 17):
        assert torch.equal(matrix.select(x[:n], rows), expected[:n, rows]), n
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        assert torch.equal(matrix(x[:17]), expected[:17])
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("qtype", QUANT_TYPES + FLOAT_TYPES)
def test_rows_read_from_the_tiles_are_the_dequantisers_bits(qtype, path):
    """A row read back from the tile layout (a tied embedding's lookup) is the reference dequantiser's row, bit for
    bit: every type, random blocks (every quant bit pattern) and real ones, rows in every tile
    and the last padded one."""
    rows = torch.tensor([39, 0, 17, 17, 31, 5, 16, 15])
    matrices = [matrix_bytes(qtype, 10)] + ([matrix_bytes(qtype, 11,
                                                          gaussian=True)] if qtype in GGUF_QUANTISABLE else [])
    for raw in matrices:
        matrix = QuantMatrix(qtype, raw, (OUT, IN), path=path)
        expected = dequantize_reference(qtype, raw, (OUT, IN))[rows]
        assert torch.equal(matrix.rows(rows).view(torch.int32), expected.view(torch.int32))
    assert matrix.rows(torch.tensor([], dtype=torch.int64)).shape == (0, IN)
    with pytest.raises(IndexError, match=r"rows must lie in \[0, 40\)"):
        matrix.rows(torch.tensor([40]))  # a padding row of the last tile is not a row of the matrix


@pytest.mark.parametrize("path", PATHS)
def test_rows_of_real_gemma_tensors_are_the_dequantisers_bits(path):
    model = GGUFFile(gemma())
    for name in GEMMA_TENSORS:
        info = model.info(name)
        rows = 40
        raw = model.raw(name)[:rows * info.nbytes // info.shape[0]]
        matrix = QuantMatrix(info.qtype, raw, (rows, info.shape[1]), path=path)
        picked = torch.tensor([0, 39, 20, 3])
        expected = dequantize_reference(info.qtype, raw, (rows, info.shape[1]))[picked]
        assert torch.equal(matrix.rows(picked), expected), name


@pytest.mark.parametrize("qtype", QUANT_TYPES + FLOAT_TYPES)
def test_accuracy_against_the_exactly_dequantised_weights(qtype):
    """Relative error (Frobenius, float64 truth) of 8-bit activations: below 2% (measured 0.5-0.8%, as llama.cpp's
    Q8 activations give); float matrices: below 1e-5 (float32 sums)."""
    raw = matrix_bytes(qtype, 4, out=64, gaussian=qtype in GGUF_QUANTISABLE)
    torch.manual_seed(3)
    x = torch.randn(8, IN)
    y = QuantMatrix(qtype, raw, (64, IN))(x).to(torch.float64)
    truth = x.to(torch.float64) @ exact_weights(qtype, raw, (64, IN)).T
    error = float((y - truth).norm() / truth.norm())
    assert error < (1e-5 if qtype in FLOAT_TYPES else 2e-2), error


@pytest.mark.parametrize("qtype", FLOAT_TYPES)
def test_a_float_matrix_of_any_width_equals_the_reference(qtype):
    raw = float_raw(qtype, np.random.default_rng(8).standard_normal((7, 12)).astype(np.float32))
    x = torch.randn(2, 12)
    assert torch.equal(QuantMatrix(qtype, raw, (7, 12))(x), reference_matmul(qtype, raw, (7, 12), x))


def test_the_matrix_keeps_its_gguf_bytes_not_a_float_copy():
    raw = matrix_bytes("Q4_K", 5, out=48)
    assert QuantMatrix("Q4_K", raw, (48, IN)).nbytes == raw.numel()
    assert QuantMatrix("Q4_K", matrix_bytes("Q4_K", 5), (OUT, IN)).nbytes == 48 * IN // 256 * 144  # padded tile


def test_a_path_the_cpu_lacks_is_refused_by_name(monkeypatch):
    assert available_paths(AVX2_ONLY) == ("avx2", "scalar")
    assert chosen_path(flags=AVX2_ONLY) == "avx2"
    with pytest.raises(CPUPathError, match="lacks avx512f, avx512bw, avx512vl, avx512_vnni.*can run avx2, scalar"):
        chosen_path("avx512vnni", flags=AVX2_ONLY)
    assert available_paths(AVX512_VNNI) == ("avx512vnni", "avx2", "scalar")
    with pytest.raises(CPUPathError, match="amx .*lacks amx_tile, amx_int8 .*can run avx512vnni, avx2, scalar; unset"):
        chosen_path("amx", flags=AVX512_VNNI)
    monkeypatch.setenv("POWER_CPU_PATH", "sve")
    with pytest.raises(CPUPathError, match="'sve' .*POWER_CPU_PATH.* choose one of amx, avx512vnni, "
                                           "avxvnni, avx2, scalar"):
        QuantMatrix("Q8_0", matrix_bytes("Q8_0", 6), (OUT, IN))
    monkeypatch.setenv("POWER_CPU_PATH", PATHS[-1])
    assert QuantMatrix("Q8_0", matrix_bytes("Q8_0", 6), (OUT, IN)).path == "scalar"


# Linux refuses a process AMX tile data while one of its threads has an alternate signal stack too small for the
# signal frame with the tiles (arch/x86/kernel/fpu/xstate.c, validate_sigaltstack), before anything asked for it.
REFUSED_TILE_DATA = """
import ctypes
class Stack(ctypes.Structure):
    _fields_ = [("sp", ctypes.c_void_p), ("flags", ctypes.c_int), ("size", ctypes.c_size_t)]
libc = ctypes.CDLL(None, use_errno=True)
memory = ctypes.create_string_buffer(4096)
assert libc.sigaltstack(ctypes.byref(Stack(ctypes.cast(memory, ctypes.c_void_p), 0, 4096)), None) == 0
from power.kernels.cpu.build import available_paths, chosen_path
print(available_paths(FLAGS))
chosen_path("amx", flags=FLAGS)
"""


def test_amx_that_linux_refuses_this_process_is_refused_with_the_reason():
    program = REFUSED_TILE_DATA.replace("FLAGS", f"frozenset({sorted(AMX)!r})")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "('avx512vnni', 'avx2', 'scalar')"
    assert "CPUPathError: CPU path amx (POWER_CPU_PATH): Linux refused this process AMX tile data: arch_prctl(" \
           "ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) failed with E" in done.stderr


def test_bytes_of_the_wrong_size_or_an_unsupported_type_are_named():
    with pytest.raises(ValueError, match="2176 bytes for Q8_0"):
        QuantMatrix("Q8_0", torch.zeros(100, dtype=torch.uint8), (4, 512))
    with pytest.raises(ValueError, match="bytes on the CPU, got them on meta"):
        QuantMatrix("Q8_0", torch.zeros(2176, dtype=torch.uint8, device="meta"), (4, 512))
    with pytest.raises(ValueError, match="Q4_1 has no CPU kernel"):
        QuantMatrix("Q4_1", torch.zeros(20, dtype=torch.uint8), (1, 32))


def test_torch_compile_traces_through_a_product_and_keeps_its_bits():
    matrix = QuantMatrix("Q4_K", matrix_bytes("Q4_K", 7), (OUT, IN))
    compiled = torch.compile(lambda x: matrix(x * 2.0) + 1.0, fullgraph=True)
    x = torch.randn(3, IN)
    assert torch.equal(compiled(x), matrix(x * 2.0) + 1.0)


def test_a_build_without_a_compiler_says_what_it_needs(tmp_path):
    """In a fresh process and cache directory (a loaded path's ops cannot be registered twice in one process)."""
    env = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"), "POWER_KERNEL_CACHE": str(tmp_path / "kernels")}
    done = subprocess.run([sys.executable, "-c", "from power.kernels.cpu.build import extension; extension('scalar')"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "KernelBuildError: building the scalar CPU kernels failed" in done.stderr
    assert "they need a C++20 compiler with OpenMP (g++ or clang++) and ninja (the `ninja` package" in done.stderr
    assert [path.name for path in (tmp_path / "kernels").iterdir()] == [f".scalar-{build_key('scalar')}.lock"]


@pytest.mark.parametrize("qtype", ("Q8_0", "Q6_K", "F16"))
def test_the_thread_count_does_not_change_a_bit(qtype):
    matrix = QuantMatrix(qtype, matrix_bytes(qtype, 9, out=160), (160, IN))  # 10 tiles to share out
    x = torch.randn(6, IN)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = matrix(x)
        torch.set_num_threads(3)
        assert torch.equal(matrix(x), alone)
    finally:
        torch.set_num_threads(threads)
