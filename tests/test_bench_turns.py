"""`power bench` one configuration at a time on the real llama-server: two plans whose summed sizing does not fit
the device run in turn, and the deployment's own server on its port is stopped first and restored afterwards, also
when the run fails midway and on Ctrl-C: a plain process, and a systemd unit in a real systemd (tests/systemd_host.py)
that systemd still supervises afterwards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import systemd_host
from click.testing import CliRunner
from llama_server import binary

from power.app.bench import standing, systemd_unit
from power.app.cli import main
from power.app.live import free_port

pytestmark = pytest.mark.llama_server  # outside `scripts/test --fast`: launches the real llama-server

REPO = Path(__file__).resolve().parent.parent
MANIFEST = REPO / "examples" / "fleet" / "manifests" / "gemma3-270m.toml"
PROFILES = REPO / "examples" / "fleet" / "profiles"
# Each plan needs about 0.68 GiB (llama-server's sizing of the bundled Gemma at ctx 4096); 1.5 GiB less the 512 MiB
# headroom holds one of them, not both.
DEVICE = "1536 MiB"
BENCH = ("--engine", "llama-server", "--shapes", "echo,identity", "--runs", "3", "--max-tokens", "8",
         "--prompt-tokens", "64", "--threads", "1")


def run(*args):
    return CliRunner().invoke(main, [*map(str, args)])


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("turns")
    paths = []
    for name in ("ngram", "target-only"):
        path = folder / f"{name}.json"
        planned = run("plan", MANIFEST, PROFILES / f"{name}.toml", "--device", DEVICE, "--engine", "llama-server",
                      "-o", path)
        assert planned.exit_code == 0, planned.output
        paths.append(path)
    return paths[0], paths[1]


@pytest.fixture()
def deployment(tmp_path: Path):
    """The deployment's server as an operator started it: target-only on its own port, its log in a file."""
    port = free_port()
    log = tmp_path / "deployment.log"
    argv = [str(binary()), "-m", str(REPO / "models" / "gemma-3-270m-q4_k_m.gguf"), "--host", "127.0.0.1",
            "--port", str(port), "-c", "512", "-t", "1"]
    with open(log, "wb") as output:
        original = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, "DEPLOYMENT_MARK": "kept"}, cwd=tmp_path)
    _wait_healthy(port)
    yield port, original, argv
    original.kill()
    original.wait()
    found = standing.find(port)
    if found is not None:  # the restored server
        os.kill(found.pid, signal.SIGTERM)


def _wait_healthy(port: int, timeout_s: float = 300, gave_up=lambda: "") -> None:
    """Until a server answers healthy on `port`; `gave_up()` says why no server will (its text ends the wait)."""
    deadline = time.monotonic() + timeout_s
    while not standing.healthy(port):
        assert time.monotonic() < deadline, f"nothing healthy on port {port}"
        reason = gave_up()
        assert not reason, reason
        time.sleep(0.5)


def _assert_restored(port: int, original: subprocess.Popen, argv: list[str]) -> None:
    """Back and healthy, started exactly as the original was: its command line, folder and environment."""
    assert original.wait(timeout=60) is not None  # the bench stopped the original
    restored = standing.find(port)
    assert restored is not None and restored.pid != original.pid and standing.healthy(port)
    assert restored.argv == argv and restored.env.get("DEPLOYMENT_MARK") == "kept"
    assert restored.output is not None and restored.output.endswith("deployment.log")


def _launcher(tmp_path: Path, fail_at_start: int | None = None) -> tuple[Path, Path]:
    """The real binary behind a script that records every server it starts, and (the injected failure) exits
    instead of starting the server at start number `fail_at_start`."""
    pids, script = tmp_path / "started.pids", tmp_path / "llama-server"
    failure = (f'if [ "$(wc -l < {pids})" -ge {fail_at_start - 1} ]; then echo injected failure >&2; exit 3; fi\n'
               if fail_at_start else "")
    script.write_text(f"#!/bin/sh\ntouch {pids}\n{failure}echo $$ >> {pids}\nexec {binary()} \"$@\"\n")
    script.chmod(0o755)
    return script, pids


def _all_stopped(pids: Path) -> bool:
    return all(standing._gone(int(pid)) for pid in pids.read_text().split())


def test_plans_that_do_not_fit_together_run_in_turn_around_a_stopped_and_restored_deployment(
        plans, deployment, tmp_path: Path) -> None:
    port, original, argv = deployment
    candidate, baseline = plans
    launcher, pids = _launcher(tmp_path)
    evidence = tmp_path / "evidence.json"
    result = run("bench", candidate, "--vs", baseline, *BENCH, "--engine-binary", launcher,
                 "--deployment-port", port, "-o", evidence)
    assert result.exit_code == 0, result.output
    assert "cannot be resident together" in result.output
    document = json.loads(evidence.read_text())
    assert document["protocol"]["residency"] == "sequential"
    assert "1.00 GiB usable" in document["protocol"]["residency_reason"]
    events = [(e["event"], e["what"]) for e in document["lifecycle"]]
    assert events[:2] == [("stop", "deployment"), ("stopped", "deployment")]
    assert events[-2:] == [("start", "deployment"), ("healthy", "deployment")]
    turns = [what for event, what in events[2:-2] if event == "start"]
    assert turns == ["candidate", "baseline", "baseline", "candidate", "candidate", "baseline"]  # alternating
    # never two configurations up at once: every start is followed by its own stop before the next start
    middle = [(event, what) for event, what in events[2:-2] if event in ("start", "stop")]
    assert all(middle[i][0] == "start" and middle[i + 1] == ("stop", middle[i][1]) for i in range(0, len(middle), 2))
    assert document["shapes"]["identity"]["parity"] and document["lossless"]["proven"]
    assert len(pids.read_text().split()) == 6 and _all_stopped(pids)
    _assert_restored(port, original, argv)


def test_a_failure_midway_stops_what_it_started_and_restores_the_deployment(plans, deployment, tmp_path) -> None:
    port, original, argv = deployment
    candidate, baseline = plans
    launcher, pids = _launcher(tmp_path, fail_at_start=3)  # the second run's first configuration never starts
    result = run("bench", candidate, "--vs", baseline, *BENCH, "--engine-binary", launcher,
                 "--deployment-port", port, "-o", tmp_path / "evidence.json")
    assert result.exit_code == 2 and "PWR471" in result.output and "injected failure" in result.output
    assert not (tmp_path / "evidence.json").exists()
    assert len(pids.read_text().split()) == 2 and _all_stopped(pids)
    _assert_restored(port, original, argv)


def test_ctrl_c_midway_stops_what_it_started_and_restores_the_deployment(plans, deployment, tmp_path) -> None:
    port, original, argv = deployment
    candidate, baseline = plans
    launcher, pids = _launcher(tmp_path)
    log = tmp_path / "bench.log"
    with open(log, "wb") as output:
        bench = subprocess.Popen([str(Path(sys.executable).parent / "power"), "bench", str(candidate), "--vs",
                                  str(baseline), *BENCH, "--engine-binary", str(launcher), "--deployment-port",
                                  str(port)], stdout=output, stderr=subprocess.STDOUT, preexec_fn=_interruptible)
    deadline = time.monotonic() + 600
    while "run 1/3 candidate" not in log.read_text():
        assert bench.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    bench.send_signal(signal.SIGINT)
    assert bench.wait(timeout=300) != 0
    assert "restored the deployment's server" in log.read_text()
    assert _all_stopped(pids)
    _assert_restored(port, original, argv)


def _interruptible() -> None:
    """Ctrl-C's SIGINT handled as at a terminal: a test runner's worker may ignore SIGINT, and a child inherits an
    ignored signal across exec (Python then installs no KeyboardInterrupt handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


UNIT = "deployment.service"
UNIT_BENCH = (*BENCH[:BENCH.index("--runs")], "--runs", "2", *BENCH[BENCH.index("--runs") + 2:])


@pytest.fixture(scope="module")
def systemd(tmp_path_factory):
    with systemd_host.booted(tmp_path_factory.getbasetemp(), REPO) as host:
        yield host


@pytest.fixture()
def unit(plans, systemd, tmp_path: Path):
    """The deployment as an operator runs it under systemd: the baseline plan rendered as llama-server's env file,
    started by a unit (Restart=on-failure) on its own port."""
    port, env = free_port(), tmp_path / "deployment.env"
    rendered = run("render", plans[1], "--target", "llama-server-env", "-o", env)
    assert rendered.exit_code == 0, rendered.output
    systemd.install(UNIT, f"""[Unit]
Description=the deployment's llama-server
[Service]
EnvironmentFile={env}
ExecStart={binary()} $LLAMA_SERVER_EXTRA_ARGS --host 127.0.0.1 --port {port} --threads 1
Restart=on-failure
""")
    systemd.systemctl("start", UNIT)
    _wait_healthy(port, gave_up=lambda: _failed(systemd, UNIT))
    yield port, systemd.show(UNIT)
    systemd.systemctl("stop", UNIT)


def _failed(systemd, unit: str) -> str:
    """The unit's journal when systemd gave it up (Restart= past its start limit), else nothing."""
    if systemd.show(unit)["ActiveState"] != "failed":
        return ""
    return f"{unit} failed: " + systemd.run("journalctl", "-u", unit, "--no-pager", "-n", "20")


def _bench_inside(systemd, plans, tmp_path: Path, *options) -> tuple[subprocess.Popen, Path]:
    """`power bench` as an operator runs it on the unit's host: in the namespaces of its systemd."""
    candidate, baseline = plans
    log = tmp_path / "bench.log"
    with open(log, "wb") as output:
        bench = subprocess.Popen(systemd.command(str(Path(sys.executable).parent / "power"), "bench", str(candidate),
                                                 "--vs", str(baseline), *UNIT_BENCH, *map(str, options), cwd=tmp_path),
                                 stdout=output, stderr=subprocess.STDOUT, preexec_fn=_interruptible)
    return bench, log


def _assert_supervised(systemd, port: int, before: dict[str, str]) -> None:
    """Back, healthy and run by its unit again: a new main process, no Restart= fired, and the only llama-server left
    (every configuration stopped) in the unit's cgroup."""
    after = systemd.show(UNIT)
    assert after["ActiveState"] == "active" and standing.healthy(port)
    assert after["MainPID"] != before["MainPID"] and after["NRestarts"] == before["NRestarts"]
    servers = systemd.processes("llama-server")
    assert len(servers) == 1 and systemd_unit.cgroup_of(servers[0]) == after["ControlGroup"]


def test_a_systemd_unit_is_stopped_and_started_with_systemctl_around_the_turns(plans, systemd, unit, tmp_path):
    port, before = unit
    launcher, pids = _launcher(tmp_path)
    evidence = tmp_path / "evidence.json"
    bench, log = _bench_inside(systemd, plans, tmp_path, "--engine-binary", launcher, "--deployment-port", port,
                               "-o", evidence)
    assert bench.wait(timeout=900) == 0, log.read_text()
    assert f"(systemd unit {UNIT}, with systemctl)" in log.read_text()
    document = json.loads(evidence.read_text())
    assert document["protocol"]["residency"] == "sequential" and len(pids.read_text().split()) == 4
    deployment = [event for event in document["lifecycle"] if event["what"] == "deployment"]
    assert [(e["event"], e["unit"], e["active_state"]) for e in deployment] == [
        ("stop", UNIT, "active"), ("stopped", UNIT, "inactive"), ("start", UNIT, "active"), ("healthy", UNIT, "active")]
    assert deployment[0]["pid"] == int(before["MainPID"])
    assert deployment[-1]["pid"] == int(systemd.show(UNIT)["MainPID"])
    _assert_supervised(systemd, port, before)


def test_a_failure_midway_starts_the_unit_again(plans, systemd, unit, tmp_path) -> None:
    port, before = unit
    launcher, pids = _launcher(tmp_path, fail_at_start=3)  # the second run's first configuration never starts
    bench, log = _bench_inside(systemd, plans, tmp_path, "--engine-binary", launcher, "--deployment-port", port)
    assert bench.wait(timeout=900) == 2, log.read_text()
    assert "PWR471" in log.read_text() and "injected failure" in log.read_text()
    assert len(pids.read_text().split()) == 2
    _assert_supervised(systemd, port, before)


def test_ctrl_c_midway_starts_the_unit_again(plans, systemd, unit, tmp_path) -> None:
    port, before = unit
    launcher, _ = _launcher(tmp_path)
    bench, log = _bench_inside(systemd, plans, tmp_path, "--engine-binary", launcher, "--deployment-port", port)
    deadline = time.monotonic() + 600
    while "run 1/2 candidate" not in log.read_text():
        assert bench.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    os.kill(systemd_host.entered(bench), signal.SIGINT)
    assert bench.wait(timeout=300) != 0
    assert f"restored the deployment's server on port {port} (systemd unit {UNIT}" in log.read_text()
    _assert_supervised(systemd, port, before)


def test_a_unit_in_another_pid_namespace_is_refused_before_anything_stops(plans, systemd, unit) -> None:
    """Seen from outside the namespaces of the systemd that runs it, as a container's or a pod's server is."""
    port, before = unit
    candidate, baseline = plans
    result = run("bench", candidate, "--vs", baseline, *UNIT_BENCH, "--engine-binary", binary(),
                 "--deployment-port", port)
    assert result.exit_code == 2 and "PWR476" in result.output and "kubectl scale deployment" in result.output
    assert systemd.show(UNIT) == before and standing.healthy(port)


@pytest.fixture()
def listener(systemd):
    """A unit whose process listens on a port (Python's own http.server: these refusals never reach /health), written
    by the test, `{server}` standing for the server's command line."""
    port, name = free_port(), "listener.service"

    def started(text: str) -> int:
        systemd.install(name, text.format(server=f"{sys.executable} -m http.server --bind 127.0.0.1 {port}"))
        systemd.systemctl("start", name)
        deadline = time.monotonic() + 60
        while not standing.listening_inodes(port):
            assert time.monotonic() < deadline, "the unit's server never listened"
            time.sleep(0.2)
        return port

    yield name, started
    systemd.systemctl("kill", name)


def test_a_server_its_stopped_unit_left_behind_is_refused_before_anything_stops(plans, systemd, listener,
                                                                                tmp_path) -> None:
    name, started = listener
    port = started("[Service]\nType=oneshot\nKillMode=process\nExecStart=/bin/sh -c '{server} >/dev/null 2>&1 &'\n")
    bench, log = _bench_inside(systemd, plans, tmp_path, "--engine-binary", binary(), "--deployment-port", port)
    assert bench.wait(timeout=300) == 2, log.read_text()
    assert "PWR478" in log.read_text() and "ActiveState=inactive" in log.read_text()
    assert systemd.show(name)["ActiveState"] == "inactive" and standing.listening_inodes(port)


def test_a_unit_systemctl_cannot_stop_is_left_running(plans, systemd, listener, tmp_path) -> None:
    name, started = listener
    port = started("[Unit]\nRefuseManualStop=yes\n[Service]\nExecStart={server}\n")
    before = systemd.show(name)
    bench, log = _bench_inside(systemd, plans, tmp_path, "--engine-binary", binary(), "--deployment-port", port)
    assert bench.wait(timeout=300) == 2, log.read_text()
    assert "PWR477" in log.read_text() and f"systemctl stop {name}" in log.read_text()
    assert "restored the deployment" not in log.read_text() and "PWR473" not in log.read_text()  # nothing to restore
    assert systemd.show(name) == before and standing.listening_inodes(port)


def test_concurrency_levels_on_the_real_llama_server(tmp_path: Path) -> None:
    """Four clients at once on four slots: per level the aggregate and per-request figures, and where n-gram stops
    paying (if it does), in the evidence."""
    paths = []
    for name in ("ngram", "target-only"):
        profile = tmp_path / f"{name}-slots4.toml"
        text = (PROFILES / f"{name}.toml").read_text().replace('name = "', 'name = "slots4-', 1)
        profile.write_text(text.replace("[runtime]", "[runtime]\nslots = 4", 1))
        path = tmp_path / f"{name}.json"
        planned = run("plan", MANIFEST, profile, "--device", "16 GiB", "--engine", "llama-server", "-o", path)
        assert planned.exit_code == 0, planned.output
        paths.append(path)
    evidence = tmp_path / "evidence.json"
    result = run("bench", paths[0], "--vs", paths[1], *BENCH, "--engine-binary", binary(), "--concurrency", "1,4",
                 "-o", evidence)
    assert result.exit_code == 0, result.output
    section = json.loads(evidence.read_text())["concurrency"]
    assert section["levels"] == [1, 4] and section["slots"] == 4
    for level in ("1", "4"):
        for shape in ("echo", "identity"):
            figures = section["per_level"][level][shape]
            assert figures["candidate"]["runs"] == figures["baseline"]["runs"] == 3
            assert figures["candidate"]["aggregate_tok_s"] > 0 and figures["speedup"] > 0
    echo = section["per_level"]["4"]["echo"]
    assert echo["candidate"]["draft_n"] > 0 == echo["baseline"]["draft_n"]  # the n-gram drafted with 4 clients
    print(json.dumps({level: {shape: {"speedup": round(r["speedup"], 3),
                                      "candidate": round(r["candidate"]["aggregate_tok_s"], 2),
                                      "baseline": round(r["baseline"]["aggregate_tok_s"], 2),
                                      "per_request_candidate": round(r["candidate"]["per_request_decode_tok_s"], 2),
                                      "per_request_baseline": round(r["baseline"]["per_request_decode_tok_s"], 2)}
                              for shape, r in shapes.items()} for level, shapes in section["per_level"].items()}),
          section["stops_paying_at"], section["reason"])
