"""The dispatch point: backend selection and validation before either path runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from power.kernels import dispatch

pytestmark = pytest.mark.slow  # outside `scripts/test --fast`: interpreter-heavy or runs the real model for long


def test_auto_uses_the_reference_on_the_cpu_and_triton_on_cuda(monkeypatch):
    monkeypatch.delenv("POWER_KERNELS", raising=False)
    assert dispatch.backend(torch.device("cpu")) == "reference"
    assert dispatch.backend(torch.device("cuda", 0)) == "triton"


def test_forcing_triton_on_the_cpu_runs_the_interpreter(monkeypatch):
    monkeypatch.setenv("POWER_KERNELS", "triton")
    assert dispatch.interpreted()
    assert dispatch.backend(torch.device("cpu")) == "triton"
    monkeypatch.setenv("POWER_KERNELS", "Reference")
    assert dispatch.backend(torch.device("cpu")) == "reference"


def test_an_unknown_backend_names_the_variable(monkeypatch):
    monkeypatch.setenv("POWER_KERNELS", "cuda")
    with pytest.raises(ValueError, match=r"POWER_KERNELS='cuda' is not one of auto, triton, reference"):
        dispatch.greedy_verify(torch.zeros(2, 4), torch.zeros(1, dtype=torch.int64))


LOGITS = torch.zeros(3, 10)
PROPS = torch.zeros(2, dtype=torch.int64)
CACHE = torch.zeros(2, 2, 64, 16)  # [slots, KV heads, positions, head width]
ROW = torch.zeros(3, dtype=torch.int64)  # per-row slots or positions for 3 rows


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: dispatch.greedy_verify(torch.zeros(10, 3).T, PROPS),
            r"`logits` is not contiguous; pass "
            r"`logits.contiguous\(\)`",
        ),
        (
            lambda: dispatch.greedy_verify(LOGITS.double(), PROPS),
            r"`logits` has dtype float64; expected one of "
            r"float32, float16, bfloat16",
        ),
        (lambda: dispatch.greedy_verify(LOGITS, PROPS.float()), r"`proposals` has dtype float32"),
        (lambda: dispatch.greedy_verify(LOGITS[0], PROPS), r"`logits` must have 2 dimension\(s\), got shape \(10,\)"),
        (lambda: dispatch.greedy_verify(LOGITS, PROPS[:1]), r"`logits` has 3 rows but `proposals` has 1 entries"),
        (lambda: dispatch.greedy_verify(LOGITS, PROPS.to("meta")), r"inputs must share one device"),
        (lambda: dispatch.greedy_verify(LOGITS.numpy(), PROPS), r"`logits` must be a torch.Tensor, got ndarray"),
        (
            lambda: dispatch.greedy_verify(torch.zeros(1, 0), PROPS[:0]),
            r"`logits` needs at least one vocabulary column",
        ),
        (
            lambda: dispatch.rejection_step(
                LOGITS.double(), LOGITS[:2].double(), PROPS, torch.zeros(3, 2, dtype=torch.float64)
            ),
            r"`uniforms` has shape \(3, 2\); expected \(3, 3\)",
        ),
        (
            lambda: dispatch.rejection_step(
                LOGITS.double(), LOGITS[:1].double(), PROPS, torch.zeros(3, 3, dtype=torch.float64)
            ),
            r"`draft_probs` has shape \(1, 10\); expected \(2, 10\)",
        ),
        (
            lambda: dispatch.rejection_step(
                LOGITS.double(), LOGITS[:2].float(), PROPS, torch.zeros(3, 3, dtype=torch.float64)
            ),
            r"`draft_probs` has dtype float32; expected one of float64",
        ),
        (
            lambda: dispatch.rejection_step(
                LOGITS.double(), LOGITS[:2].double(), PROPS + 10, torch.zeros(3, 3, dtype=torch.float64)
            ),
            r"`proposals` holds a token ID outside \[0, 10\)",
        ),
        (
            lambda: dispatch.fr_argmax(torch.zeros(2, 8), torch.zeros(50, 8), 51),
            r"`n_prefix` is 51; "
            r"expected 1 <= n_prefix <= 50",
        ),
        (
            lambda: dispatch.fr_argmax(torch.zeros(2, 8), torch.zeros(50, 9), 5),
            r"`hidden` is 8 wide but "
            r"`head_weight` rows are 9 wide",
        ),
        (
            lambda: dispatch.qmatmul(torch.zeros(2, 64), torch.zeros(3, 35, dtype=torch.uint8), "Q8_0"),
            r"`weight` rows hold 35 bytes; Q8_0 rows of 64 weights \(x's columns\) need 68",
        ),
        (
            lambda: dispatch.qmatmul(torch.zeros(2, 40), torch.zeros(3, 34, dtype=torch.uint8), "Q8_0"),
            r"`x` has 40 columns, not a multiple of Q8_0's block of 32",
        ),
        (
            lambda: dispatch.qmatmul(torch.zeros(2, 32), torch.zeros(3, 64, dtype=torch.uint8), "BF16"),
            r"`qtype` 'BF16' is not supported",
        ),
        (
            lambda: dispatch.qmatmul(torch.zeros(2, 40), torch.zeros(3, 80, dtype=torch.uint8), "F16"),
            r"`x` has 40 columns, not a multiple of F16's block of 32",
        ),
        (
            lambda: dispatch.dequantize("Q4_0", torch.zeros(17, dtype=torch.uint8), (1, 32)),
            r"`raw` holds 17 bytes; Q4_0 of shape \(1, 32\) needs 18",
        ),
        (
            lambda: dispatch.dequantize("Q4_K", torch.zeros(144, dtype=torch.uint8), (2, 128)),
            r"not a multiple of Q4_K's block of 256",
        ),
        (
            lambda: dispatch.dequantize("IQ2_XXS", torch.zeros(1, dtype=torch.uint8), (1, 256)),
            r"`qtype` 'IQ2_XXS' is not supported",
        ),
        (
            lambda: dispatch.dequantize("Q8_0", torch.zeros(34, dtype=torch.int8), (1, 32)),
            r"`raw` has dtype int8; "
            r"expected one of uint8",
        ),
        (
            lambda: dispatch.attention(torch.zeros(3, 3, 16), CACHE, CACHE, ROW, ROW, 0.25),
            r"`q` has 3 heads, not a multiple of the caches' 2 KV heads",
        ),
        (
            lambda: dispatch.attention(torch.zeros(3, 4, 8), CACHE, CACHE, ROW, ROW, 0.25),
            r"caches have shapes \(2, 2, 64, 16\) and \(2, 2, 64, 16\); expected \[slots, Hkv, capacity, 8\]",
        ),
        (
            lambda: dispatch.attention(torch.zeros(3, 4, 16), CACHE, CACHE, ROW[:2], ROW, 0.25),
            r"`slots` has 2 entries; expected one per row \(3\)",
        ),
        (
            lambda: dispatch.attention(torch.zeros(3, 4, 16), CACHE, CACHE, ROW, ROW.int(), 0.25),
            r"`positions` has dtype int32; expected one of int64",
        ),
        (lambda: dispatch.attention(torch.zeros(3, 4, 16), CACHE, CACHE, ROW, ROW, 0.25, -1), r"`window` is -1"),
        (
            lambda: dispatch.cache_write(torch.zeros(3, 2, 16), torch.zeros(3, 2, 8), CACHE, CACHE, ROW, ROW),
            r"`v` has shape \(3, 2, 8\); expected \(3, 2, 16\)",
        ),
        (
            lambda: dispatch.rms_norm(torch.zeros(3, 16), torch.zeros(8), 1e-6),
            r"`weight` has shape \(8,\); expected x's trailing dimensions",
        ),
        (
            lambda: dispatch.rms_norm(torch.zeros(3, 16).double(), None, 1e-6),
            r"`x` has dtype float64; "
            r"expected one of float32",
        ),
    ],
)
@pytest.mark.parametrize("path", ["triton", "reference"])
def test_bad_input_is_a_value_error_naming_the_argument(monkeypatch, path, call, message):
    monkeypatch.setenv("POWER_KERNELS", path)
    with pytest.raises(ValueError, match=message):
        call()


def test_forcing_triton_on_the_cpu_without_the_interpreter_says_how_to_fix_it():
    """Kernels compiled for a GPU cannot take CPU tensors: a clear error, not a crash inside Triton."""
    probe = (
        "import torch\n"
        "from power.kernels import dispatch\n"
        "assert not dispatch.interpreted()\n"
        "try:\n"
        "    dispatch.greedy_verify(torch.zeros(2, 4), torch.zeros(1, dtype=torch.int64))\n"
        "except ValueError as err:\n"
        "    print(err)\n"
    )
    env = os.environ | {"TRITON_INTERPRET": "0", "POWER_KERNELS": "triton"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "POWER_KERNELS=triton on a cpu device needs Triton's interpreter: set TRITON_INTERPRET=1" in done.stdout
