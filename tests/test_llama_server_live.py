"""The real llama-server, launched from Power's renders of Gemma plans (CPU): it runs what the plan says.

One server per plan for the module (target-only and n-gram, started together), on free loopback ports, stopped
at the end; a third starts from the LLAMA_ARG_* env-file render. Each request measures the engine's own counters.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from llama_server import binary

from power.app.bench.traffic import build_shape
from power.app.live import LiveEngine, free_port
from power.app.served import ServedEngine
from power.documents.plan import load_plan, save_plan
from power.orchestrator.inputs.loading import load_manifest, load_profile
from power.orchestrator.inputs.schema import DeviceSpec, HostSpec
from power.orchestrator.launch.render import Listen, render
from power.orchestrator.planning.compile import compile_plan

pytestmark = pytest.mark.llama_server  # outside `scripts/test --fast`: launches the real llama-server

REPO = Path(__file__).resolve().parent.parent
GEMMA = REPO / "manifests" / "gemma3-270m.toml"
CTX = 1024
PROFILES = {
    "target-only": 'spec_mode = "none"\n',
    "ngram": 'spec_mode = "ngram"\nspec_draft_max = 7\nspec_mtp_recurrent_snapshots = 7\n',
}
NGRAM_RUNTIME = "ngram_match = 4\nngram_draft_min = 2\n"


def _plan(directory: Path, name: str) -> Path:
    profile = directory / f"{name}.toml"
    runtime = f"[runtime]\nctx = {CTX}\nverify_capacity = 8\n" + (NGRAM_RUNTIME if name == "ngram" else "")
    profile.write_text(f'schema = "power.profile/v1"\nname = "{name}"\n{PROFILES[name]}{runtime}')
    host = HostSpec(name="cpu", devices=[DeviceSpec(model="cpu", vram=16 << 30)])
    plan, findings = compile_plan(load_manifest(GEMMA), load_profile(profile), host, engine="llama-server")
    assert plan is not None, [f.render() for f in findings]
    path = directory / f"{name}.plan.json"
    save_plan(plan, path)
    return path


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    directory = tmp_path_factory.mktemp("live")
    engines = {}
    try:
        for name in PROFILES:
            path = _plan(directory, name)
            engines[name] = LiveEngine("llama-server", load_plan(path), path, binary(), threads=1)
        for engine in engines.values():  # both load at once
            engine.start_process()
        for engine in engines.values():
            engine.wait_healthy()
        yield engines
    finally:
        for engine in engines.values():
            engine.stop()


def _complete(engine: LiveEngine, shape: str, max_tokens: int = 32):
    traffic = build_shape(shape, max_tokens)
    return ServedEngine(engine).generate(traffic.prompt, traffic.max_tokens)


def test_the_rendered_lines_start_and_answer_health(servers):
    for engine in servers.values():
        assert engine.process is not None and engine.process.poll() is None
        assert engine.get_json("/health") == {"status": "ok"}


def test_slots_context_and_speculation_are_the_plans(servers):
    for name, engine in servers.items():
        runtime = engine.plan.runtime
        props = engine.props()
        assert props["total_slots"] == runtime.slots == 1
        assert props["default_generation_settings"]["n_ctx"] == runtime.ctx // runtime.slots
        assert props["endpoint_metrics"] is True
        log = engine.log_text()
        assert f"n_slots = {runtime.slots}, n_ctx_slot = {runtime.ctx // runtime.slots}, kv_unified = 'false'" in log
        params = props["default_generation_settings"]["params"]
        assert (params["seed"], params["temperature"], params["top_k"], params["top_p"], params["min_p"]) == (
            0, 0.0, 0, 1.0, 0.0)
        receipt = _complete(engine, "identity")
        types = receipt.runtime["generation_settings"]["speculative.types"]
        assert types == ("none,ngram-mod" if name == "ngram" else "none")
    # ngram-mod prints no banner; its settings are what the render wrote (llama.cpp warns below 16 tokens)
    assert "ngram_mod n_match=4 is too small" in servers["ngram"].log_text()


def test_ngram_drafts_are_accepted_on_the_echo_shape_and_target_only_drafts_nothing(servers):
    echo = _complete(servers["ngram"], "echo", 48)
    assert echo.proposed > 0 and echo.accepted > echo.proposed // 2, echo.runtime
    assert (
        echo.speculative_rounds > 0 and echo.runtime["counters"]["spec_decode_num_draft_tokens_total"] == echo.proposed
    )
    control = _complete(servers["target-only"], "echo", 48)
    assert control.proposed == 0 and control.speculative_rounds == 0


@pytest.mark.parametrize("shape", ["echo", "identity"])
def test_greedy_output_equals_the_target_only_lines(servers, shape):
    speculative, control = (_complete(servers[name], shape) for name in ("ngram", "target-only"))
    assert len(control.token_ids) >= 8 and control.text.strip(), "a vacuous output proves nothing"
    assert speculative.token_ids == control.token_ids and speculative.text == control.text


def test_the_llama_arg_env_file_runs_the_same_server(tmp_path, servers):
    engine = servers["ngram"]
    port = free_port()
    env_file = tmp_path / "ngram.env"
    env_file.write_text(render(engine.plan, "llama-server-env", engine.plan_path, listen=Listen("127.0.0.1", port)))
    script = (f'set -a; . "{env_file}"; set +a; exec "{binary()}" $LLAMA_SERVER_EXTRA_ARGS --threads 1')
    log = tmp_path / "env.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(["bash", "-c", script], stdout=out, stderr=subprocess.STDOUT,
                                   env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/")})
    probe = LiveEngine("llama-server", engine.plan, engine.plan_path, binary(), threads=1, port=port)
    try:
        deadline = time.monotonic() + 600
        while not probe.healthy() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert probe.healthy(), log.read_text()[-3000:]
        assert probe.props()["total_slots"] == 1 and probe.props()["model_alias"] == engine.plan.name
        assert "n_slots = 1, n_ctx_slot = 1024, kv_unified = 'false'" in log.read_text()
        echo = ServedEngine(probe).generate(build_shape("echo", 32).prompt, 32)
        assert echo.proposed > 0
        assert echo.token_ids == _complete(engine, "echo").token_ids
    finally:
        process.terminate()
        process.wait(timeout=30)
