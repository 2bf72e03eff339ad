"""Kernels: Triton kernels on a GPU, each beside its torch reference (the CPU path and the test oracle).

Call them through `power.kernels.dispatch`, the one dispatch point. A module
`<name>.py` holds a kernel family's reference and constants, `<name>_triton.py`
its Triton kernels; only the dispatch imports those, on first use, so a run on
the references never loads Triton. Triton decides at import whether its kernels
compile for a GPU or run in its CPU interpreter (TRITON_INTERPRET); without CUDA
only the interpreter can run them, so that is the default here when no CUDA
device is present.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
