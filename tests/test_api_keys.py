"""API keys by reference (issue 26 item 13): every render passes the engine the key's file its own way, never the key,
and the real llama-server started from the render admits only the right key."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx
import openai
import pytest
from click.testing import CliRunner
from llama_server import binary
from test_seal import gemma_plan

from power.app.cli import main
from power.app.live import free_port

KEY = "k3y-0f-the-test-5d1c"


def render(plan: Path, target: str, *args: str):
    return CliRunner().invoke(main, ["render", str(plan), "--target", target, *args])


@pytest.fixture
def planned(tmp_path: Path) -> tuple[Path, Path]:
    model = tmp_path / "gemma.gguf"
    model.symlink_to(Path(__file__).resolve().parent.parent / "models" / "gemma-3-270m-q4_k_m.gguf")
    key_file = tmp_path / "api-key"
    key_file.write_text(KEY + "\n")
    return tmp_path, key_file


def engine_plan(planned: tuple[Path, Path], target: str) -> Path:
    """The plan sized for the engine `target` runs (a render for another engine is refused)."""
    directory, _ = planned
    engine = "llama-server" if target.startswith("llama-server") else "power"
    return gemma_plan(directory, directory / "gemma.gguf", engine)


@pytest.mark.parametrize("target, expected", [
    ("llama-server", "--api-key-file"),
    ("llama-server-env", "LLAMA_ARG_API_KEY_FILE="),
    ("power", "--api-key-file"),
    ("systemd", '"--api-key-file"'),
])
def test_each_render_names_the_key_file_never_the_key(planned, target: str, expected: str) -> None:
    _, key_file = planned
    result = render(engine_plan(planned, target), target, "--api-key-file", str(key_file))
    assert result.exit_code == 0, result.output
    assert expected in result.stdout and str(key_file) in result.stdout and KEY not in result.stdout


def test_the_kubernetes_and_env_targets_refuse_a_key_file(planned) -> None:
    _, key_file = planned
    for target in ("env", "kubernetes"):
        assert render(engine_plan(planned, target), target, "--api-key-file", str(key_file)).exit_code == 2


@pytest.mark.llama_server
def test_the_real_llama_server_from_the_render_admits_only_the_key(planned, tmp_path: Path) -> None:
    _, key_file = planned
    port = free_port()
    script = tmp_path / "serve.sh"
    rendered = render(engine_plan(planned, "llama-server"), "llama-server", "--api-key-file", str(key_file),
                      "--address", "127.0.0.1", "--port",
                      str(port), "-o", str(script))
    assert rendered.exit_code == 0, rendered.output
    log = tmp_path / "llama.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(["bash", str(script)], stdout=out, stderr=subprocess.STDOUT,
                                   env={"PATH": f"{binary().parent}:{os.environ['PATH']}", "HOME": str(tmp_path)})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while process.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:  # open for probes
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        assert process.poll() is None, log.read_text()[-3000:]
        assert httpx.post(f"{base}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}).status_code == 401
        wrong = openai.OpenAI(base_url=f"{base}/v1", api_key=KEY + "x", max_retries=0, timeout=120)
        with pytest.raises(openai.AuthenticationError):
            wrong.completions.create(model="gemma", prompt="Hi", max_tokens=2)
        right = openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0, timeout=120)
        assert right.completions.create(model="gemma", prompt="Hi", max_tokens=2).usage.completion_tokens >= 1
    finally:
        process.terminate()
        process.wait(timeout=30)
