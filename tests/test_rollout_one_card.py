"""docs/fleet.md's "A rollout on one 24 GB card", run as written against the real llama-server: the deployment's
server is up on its port, the bench measures the pair one at a time around it, and the rollout reads the evidence."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from llama_server import binary

from power.app.bench import standing
from power.app.cli import main
from power.app.live import free_port
from power.documents.plan import load_plan
from power.orchestrator.fleet.lock import read_lock
from power.orchestrator.launch.render import Listen, engine_launch

pytestmark = pytest.mark.llama_server  # outside `scripts/test --fast`: launches the real llama-server

REPO = Path(__file__).resolve().parents[1]
SECTION = (REPO / "docs" / "fleet.md").read_text().split("### A rollout on one 24 GB card", 1)[1]
COMMANDS = [line for line in re.search(r"```sh\n(.*?)```", SECTION,
                                       re.S).group(1).splitlines()  # type: ignore[union-attr]
            if line.startswith("power ")]
KEY = "card-1/gemma3-270m"


def power(root: Path, line: str):
    here = Path.cwd()
    os.chdir(root)
    try:
        return CliRunner().invoke(main, shlex.split(line)[1:])
    finally:
        os.chdir(here)


@pytest.fixture()
def lab(tmp_path: Path) -> Path:
    """The repository's layout (examples/fleet reaches the bundled model through `..`) in a folder of its own."""
    shutil.copytree(REPO / "examples" / "fleet", tmp_path / "examples" / "fleet",
                    ignore=shutil.ignore_patterns("artifacts", "*.lock", "plans"))
    (tmp_path / "models").symlink_to(REPO / "models")
    return tmp_path


def test_the_one_card_rollout_walks_as_written(lab: Path) -> None:
    review, plan, status, bench, advance = COMMANDS
    for line in (review, plan):
        assert power(lab, line).exit_code == 0, line
    shown = power(lab, status)
    assert shown.exit_code == 0 and "--engine llama-server" in shown.output, shown.output
    state, _ = read_lock(lab / "one-card.lock", "one-card")
    candidate = state.rollout["candidates"][KEY]["plan_digest"][:12]
    incumbent = state.deployments[KEY]["plan_digest"][:12]
    port = free_port()
    incumbent_plan = lab / "plans" / f"{incumbent}.json"
    launch = engine_launch(load_plan(incumbent_plan), "llama-server", incumbent_plan, Listen("127.0.0.1", port))
    with open(lab / "deployment.log", "wb") as log:
        deployment = subprocess.Popen([str(binary()), *launch.argv[1:], "--threads", "1"], stdout=log,
                                      stderr=subprocess.STDOUT, env={**os.environ, **launch.env}, cwd=lab)
    try:
        deadline = time.monotonic() + 300
        while not standing.healthy(port):
            assert deployment.poll() is None and time.monotonic() < deadline, (lab / "deployment.log").read_text()
            time.sleep(0.5)
        line = (bench.replace("CANDIDATE", candidate).replace("INCUMBENT", incumbent)
                .replace("--deployment-port 8080", f"--deployment-port {port}")
                + f" --engine-binary {binary()}")
        measured = power(lab, line)
        assert measured.exit_code in (0, 1), measured.output  # 1: a lossy shape, which the gate then refuses
        assert "cannot be resident together" in measured.output
        document = json.loads((lab / "evidence.json").read_text())
        assert document["protocol"]["residency"] == "sequential"
        events = [(e["event"], e["what"]) for e in document["lifecycle"]]
        assert events[0] == ("stop", "deployment") and events[-1] == ("healthy", "deployment")
        restored = standing.find(port)
        assert restored is not None and restored.pid != deployment.pid and standing.healthy(port)
        opened = power(lab, advance)
        echo = document["shapes"]["echo"]
        accepted = echo["verdict"] == "faster" and (echo["parity"] or echo["exactness"] == "near-tie")
        assert (opened.exit_code == 0) == (accepted and document["shapes"]["identity"]["exactness"] != "lossy"), \
            opened.output
        if opened.exit_code:
            assert "refused: stage canary stays closed" in opened.output
        else:
            assert "stage canary applied" in opened.output and "request-wide" in opened.output
    finally:
        deployment.kill()
        deployment.wait()
        found = standing.find(port)
        if found is not None:
            os.kill(found.pid, signal.SIGTERM)
