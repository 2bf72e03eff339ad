"""The GPU path on the CPU: its kernels under Triton's interpreter (POWER_KERNELS=triton) or as their torch references.

A trunk built with `kernel_path="gpu"` runs what a CUDA device runs: the Triton product on the file's rows, the
row-count-invariant attention, cache write and norms (power/kernels/). It runs real rows, so a row's bits must not
depend on the rows beside it; and its decode forwards read nothing per call but the tokens, positions and slots, so a
forward through the CUDA graphs' device buffers equals the forward through Python values (`Rerun` stands in for the
capture, which needs a GPU: scripts/gpu-check runs the real graphs).
"""

from __future__ import annotations

import pytest
import torch
from gguf_helpers import assert_rows_match_alone, fixtures

from power.runtime.cuda_graphs import CudaGraphError, Rerun
from power.runtime.trunks import load_trunk
from power.runtime.trunks.base import Part

pytestmark = pytest.mark.slow  # outside `scripts/test --fast`: interpreter-heavy

PREFIX = [5, 81, 17, 200, 33]
ROWS = [44, 102, 7, 310, 58, 91]


@pytest.fixture(autouse=True)
def one_thread():
    """The interpreter's numpy and torch's thread pool fight over the cores; one torch thread keeps runs short."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def gpu_trunk(name: str, slots: int = 1):
    return load_trunk(fixtures()[name], n_ctx=64, verify_capacity=8, snapshot_rows=8, slots=slots, kernel_path="gpu")


# (target, kernels, rows): the interpreted kernels are slow (about 2 s a forward), so they take fewer rows.
CASES = [("dense-target", "triton", 3), ("dense-target", "reference", 6), ("hybrid-target", "reference", 6)]


@pytest.mark.parametrize(("name", "kernels", "rows"), CASES)
def test_the_gpu_path_runs_real_rows_and_a_row_is_the_same_bits_at_every_row_count(monkeypatch, name, kernels, rows):
    monkeypatch.setenv("POWER_KERNELS", kernels)
    model = gpu_trunk(name)
    assert model.options.kernels and model.real_rows
    taps = (1, model.config.n_layers)
    model.prefill(PREFIX)
    assert_rows_match_alone(model, list(ROWS[:rows]), taps)


@pytest.mark.parametrize(("name", "kernels"), [("dense-target", "triton"), ("hybrid-target", "reference")])
def test_the_gpu_path_gives_sequences_sharing_a_forward_their_lone_bits(monkeypatch, name, kernels):
    """Two slots' rows in one forward (one attention launch, each row reading its own slot) equal each slot alone."""
    monkeypatch.setenv("POWER_KERNELS", kernels)
    model = gpu_trunk(name, slots=2)
    prompts = [PREFIX, PREFIX[:2]]
    for slot, prompt in enumerate(prompts):
        model.prefill(prompt, slot=slot)
    parts = [Part(0, ROWS[:1]), Part(1, ROWS[1:3])]
    together = model.forward_parts(parts)
    for slot, part in enumerate(parts):
        model.reset(slot)
        model.prefill(prompts[slot], slot=slot)
        assert torch.equal(model.forward(part.tokens, slot=slot).logits, together[slot].logits), slot


def decode(model, graphs: bool) -> list[torch.Tensor]:
    """Plain rounds, a speculative-sized round with taps, a rewind, and two slots' rows in one forward."""
    if graphs:
        model.capture_graphs(Rerun())
    for slot in range(2):
        model.prefill(PREFIX[slot:], slot=slot)
    outs = [model.forward(ROWS[:1]).logits, model.forward(ROWS[1:2]).logits]
    spec = model.forward(ROWS[2:5], taps=(1,))
    outs += [spec.logits, spec.hidden[1]]
    model.rewind(model.position - 2)
    outs.append(model.forward(ROWS[5:6]).logits)  # the one-row shape again, at new positions
    outs += [out.logits for out in model.forward_parts([Part(0, ROWS[:2]), Part(1, ROWS[2:3])])]
    return outs


def test_a_forward_through_the_graphs_device_buffers_equals_the_forward_through_python_values(monkeypatch):
    """The buffer plumbing is the same whichever backend the kernels take; the references keep it quick."""
    monkeypatch.setenv("POWER_KERNELS", "reference")
    plain, graphed = gpu_trunk("dense-target", slots=2), gpu_trunk("dense-target", slots=2)
    expected = decode(plain, graphs=False)
    got = decode(graphed, graphs=True)
    assert graphed.graphs is not None and graphed.graphs.captured == [1, 3]
    assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_graphs_are_refused_where_a_forward_reads_more_than_its_device_buffers():
    refusals = {
        "the CPU path": load_trunk(fixtures()["dense-target"], n_ctx=64, verify_capacity=4),
        "recurrent layers": gpu_trunk("hybrid-target"),
        "not a CUDA device": gpu_trunk("dense-target"),
    }
    for reason, model in refusals.items():
        recorder = None if reason == "not a CUDA device" else Rerun()
        with pytest.raises(CudaGraphError, match=reason) as refused:
            model.capture_graphs(recorder)
        assert refused.value.finding.code == "PWR607" and "cuda_graphs = false" in (refused.value.finding.hint or "")
        assert model.graphs is None


class FailingCapture:
    """Stands in for the CUDA driver refusing a capture (e.g. a host synchronisation inside it)."""

    name = "failing"

    def record(self, forward):
        raise RuntimeError(f"operation not permitted when stream is capturing ({forward.__name__})")


def test_a_failed_capture_refuses_the_forward_and_names_the_shape_and_the_fix(monkeypatch):
    monkeypatch.setenv("POWER_KERNELS", "reference")
    model = gpu_trunk("dense-target")
    model.capture_graphs(FailingCapture())
    model.prefill(PREFIX)
    with pytest.raises(CudaGraphError, match="the 2-row decode forward .* operation not permitted "
                                             "when stream is capturing") as refused:
        model.forward(ROWS[:2])
    assert "cuda_graphs = false" in (refused.value.finding.hint or "")
