"""Power's plan against the real llama-server: every component within 2% or 1 MiB of what the engine allocates.

The llama-server binary is the one scripts/build-llama-server builds from the llama.cpp sources vendored in
the llama-cpp-python sdist (scripts/test builds it before pytest; a missing binary fails these tests). Each case
launches it on the bundled Gemma 3 270M or a factory header (qwen3, qwen35 with its MTP head, llama, qwen2), reads
the buffers it logs and compares them with the plan Power compiles for the same settings.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf_helpers import REPO
from llama_server import binary

from power.app import conformance
from power.orchestrator.planning.compile import ArtifactMemo

pytestmark = pytest.mark.llama_server  # outside `scripts/test --fast`: launches the real llama-server


@pytest.fixture(scope="module")
def llama_server() -> Path:
    return binary()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    return conformance.models(tmp_path_factory.mktemp("conformance-models"), REPO / "models")


@pytest.fixture(scope="module")
def memo() -> ArtifactMemo:
    return ArtifactMemo()


@pytest.mark.parametrize("case", conformance.MATRIX, ids=[case.name for case in conformance.MATRIX])
def test_every_component_is_within_2_percent_or_1_mib_of_llama_server(case, llama_server, models, memo, tmp_path):
    plan = conformance.plan_for(case, models[case.model], tmp_path / "plan", memo)
    log = conformance.run_llama_server(llama_server, plan, case, tmp_path / "llama-server.log")
    rows = conformance.compare(case, plan, conformance.logged_buffers(log))
    table = "\n".join(f"{r.component:22} power {r.power:>12} llama-server {r.llama:>12} {r.error:+.4%}" for r in rows)
    assert all(row.ok for row in rows), table
    assert all(row.basis != "missing" for row in rows), f"a buffer the plan does not size:\n{table}"
    sized = {row.component for row in rows}
    assert {"target weights", "target compute buffer", "output buffer"} <= sized
    assert ("target KV (sliding)" in sized) == (case.model == "gemma3")
    assert ("recurrent state" in sized) == (case.model == "qwen35")
    assert ("MTP compute buffer" in sized) == (case.mtp_draft is not None)
    for row in rows:
        if row.basis == "exact":  # to the log's precision: MiB with 2 decimals, the compute buffer at exit with 4
            assert abs(row.power - row.llama) <= (53 if "compute" in row.component else 5243), row


def test_the_conformance_run_launches_the_rendered_line_unchanged(models, memo, tmp_path):
    """Issue 23 defect 11: the run added `-fit off` to the line, so the render it checked was not the one launched."""
    from power.orchestrator.launch.render import Listen, engine_launch

    case = conformance.MATRIX[0]
    plan = conformance.plan_for(case, models[case.model], tmp_path / "plan", memo)
    rendered = engine_launch(plan, "llama-server", Path(), Listen("127.0.0.1", 8080)).argv
    launched = conformance.launch_argv(Path("llama-server"), plan, 8080, threads=2)
    assert launched[: len(rendered)] == ["llama-server", *rendered[1:]]
    assert rendered[rendered.index("--fit") + 1] == "off"
    extra = launched[len(rendered):]
    assert extra == ["-lv", "5", "-t", "2", "--no-warmup"]  # observation only: nothing the plan sizes
