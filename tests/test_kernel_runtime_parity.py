"""The runtime emits the same tokens through the Triton kernels (interpreted here) as through the references.

Everything the runtime routes through `power.kernels.dispatch` switches with
POWER_KERNELS: weight dequantisation at load (the fixture target stores its
layers as Q4_0, Q5_0, Q8_0 and F16), greedy verification, the rejection step and
the DFlash draft head's FR argmax. Each path loads its own trunk and drafter.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from spec_helpers import Oracle

from power.artifacts import factory
from power.runtime.decoder import Decoder
from power.runtime.gguf_weights import GGUFFile
from power.runtime.sampling import Sampler, SamplingParams
from power.runtime.scheduler import SchedulerConfig
from power.runtime.speculators import registry
from power.runtime.speculators.base import NGramWindow, SpeculatorRequest
from power.runtime.trunks import load_trunk

pytestmark = pytest.mark.slow  # outside `scripts/test --fast`: interpreter-heavy or runs the real model for long

PROMPT = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 32, 84, 104, 101, 32]
K = 4


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("kernel-parity")
    return {"target": factory.build_dense_target(directory), "dflash": factory.build_dflash_drafter(directory)}


@pytest.fixture
def one_thread():
    """The interpreter's numpy and torch's thread pool fight over the cores; one torch thread keeps runs short."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def generate(fixtures: dict[str, Path], speculator: str | None, params: SamplingParams, n_tokens: int):
    """`speculator`: a registry name, None, or "oracle": the plain continuation with each
    round's third proposal wrong."""
    trunk = load_trunk(fixtures["target"], n_ctx=256, verify_capacity=K + 1)
    if speculator == "oracle":
        truth = PROMPT + generate(fixtures, None, params, n_tokens).tokens
        drafter = Oracle(truth, then=2, vocab=trunk.config.vocab_size)
    elif speculator is not None:
        drafter = fixtures.get(speculator)
        request = SpeculatorRequest(trunk=trunk, drafter=drafter and GGUFFile(drafter),
                                    target=GGUFFile(fixtures["target"]), fr_vocab_size=300, ngram=NGramWindow(2, 1, 64))
        drafter = registry.build(speculator, request)
    else:
        drafter = None
    decoder = Decoder(trunk, Sampler(params), drafter, SchedulerConfig(k=K, s=K))
    return decoder.generate(PROMPT, n_tokens)


@pytest.mark.parametrize(
    ("speculator", "params"),
    [
        ("ngram", SamplingParams()),
        ("dflash", SamplingParams()),
        ("dflash", SamplingParams(temperature=0.8, seed=3, verify="rejection")),
        ("oracle", SamplingParams(temperature=1e-3, seed=5, verify="rejection")),
    ],
    ids=["ngram-greedy", "dflash-fr-greedy", "dflash-fr-rejection", "oracle-rejection"],
)
@pytest.mark.usefixtures("one_thread")
def test_triton_and_reference_paths_emit_identical_tokens(monkeypatch, fixtures, speculator, params):
    runs = {}
    for path in ("triton", "reference"):
        monkeypatch.setenv("POWER_KERNELS", path)
        runs[path] = generate(fixtures, speculator, params, n_tokens=20)
    assert runs["triton"].tokens == runs["reference"].tokens
    assert len(runs["triton"].tokens) == 20
    stats = runs["triton"].stats
    assert (stats.proposed, stats.accepted) == (runs["reference"].stats.proposed, runs["reference"].stats.accepted)
    assert stats.proposed > 0  # the verify kernels ran on real proposals
    if speculator == "ngram":
        assert stats.accepted > 0  # the repetitive fixture stream feeds the n-gram index
    if speculator == "oracle":
        assert 0 < stats.accepted < stats.proposed  # the rejection kernel both kept and corrected proposals
