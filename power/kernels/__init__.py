"""Kernels: Triton kernels on a GPU, each beside its torch reference (the CPU path and the test oracle).

Call them through `power.kernels.dispatch`, the one dispatch point. Triton
decides at import whether its kernels compile for a GPU or run in its CPU
interpreter (TRITON_INTERPRET); without CUDA only the interpreter can run them,
so that is the default here when no CUDA device is present.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    from power.kernels import interpreter

    interpreter.install()
