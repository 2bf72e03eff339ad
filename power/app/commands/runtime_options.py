"""The options every command that loads the runtime shares: device, weight dtypes and threads."""

from __future__ import annotations

import click

from power.documents.dtypes import WEIGHT_DTYPES

# One default for every command that loads the runtime: the same plan gives the same greedy tokens in run, serve
# and bench unless the operator asks otherwise (bfloat16 rounds the weights, and its tokens can differ).
DEFAULT_DTYPE = "float32"


def runtime_options(command):
    """Adds --device, --dtype, --lm-head-dtype and --threads (parameters device, dtype, lm_head_dtype, threads)."""
    options = [
        click.option("--device", default="auto", show_default=True,
                     help="Where the target runs: auto (a CUDA GPU when torch sees one, else the CPU), cpu, cuda "
                          "or cuda:N. An unavailable device is an error, never a silent CPU run."),
        click.option("--dtype", type=click.Choice(WEIGHT_DTYPES), default=DEFAULT_DTYPE, show_default=True,
                     help="Weight dtype of the layers' matrices: float32 (exact dequantised weights), bfloat16 "
                          "(half the bytes; about 5x faster than float32 on AVX512-BF16 CPUs) or int8 (rows "
                          "requantised, activations at two int8 levels; CPU only). Norms, activations and the "
                          "cache stay float32."),
        click.option("--lm-head-dtype", type=click.Choice(WEIGHT_DTYPES), default=None,
                     help="Weight dtype of the LM head (default: --dtype). int8 halves the bytes of a "
                          "bfloat16 head, the largest matrix of a small-vocabulary-heavy model such as Gemma 3 270M."),
        click.option("--threads", type=click.IntRange(min=1), default=None,
                     help="Torch intra-op threads (default: torch's)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command
