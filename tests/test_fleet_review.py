"""`power fleet review`: every deployment planned and checked, located fleet findings, device
sums, drift, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from fleet_world import World, build_world, write

import power.orchestrator.planning.compile as compiler
from power.app.cli import main

TWO_HOSTS = '''
[[hosts]]
name = "ws-1"
devices = [{ model = "RTX 4090", vram = "24 GiB" }]
labels = { rollout = "canary" }

[[hosts]]
name = "ws-2"
devices = [{ model = "RTX 6000 Ada", vram = "48 GiB" }]
'''

CLEAN = '''
[[deployments]]
host = "ws-1"
manifest = "manifests/hybrid.toml"
profile = "profiles/balanced.toml"

[[deployments]]
host = "ws-2"
manifest = "manifests/dense.toml"
profile = "profiles/ngram.toml"
traffic = "echo"
'''


@pytest.fixture()
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    monkeypatch.setenv("POWER_CACHE_DIR", str(tmp_path / "cache"))
    return build_world(tmp_path / "world")


def review(*args: str):
    return CliRunner().invoke(main, ["fleet", "review", *map(str, args)])


def test_a_clean_fleet_is_planned_and_tabled_by_host(world: World) -> None:
    result = review(world.fleet(TWO_HOSTS, CLEAN))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    hybrid = next(line for line in lines if "ws-1/hybrid" in line).split()
    assert hybrid[:3] == ["ws-1/hybrid", "0", "fits"]
    assert hybrid[5:8] == ["mtp", "7/7", "full"]
    dense = next(line for line in lines if "ws-2/dense" in line).split()
    assert "ngram" in dense and "echo" in dense
    assert "2 hosts, 2 deployments: 0 errors" in result.output


def test_json_review_carries_plans_margins_and_drift(world: World) -> None:
    result = review(world.fleet(TWO_HOSTS, CLEAN), "--json")
    assert result.exit_code == 0
    document = json.loads(result.output)
    assert document["schema"] == "power.fleet-review/v1"
    [ws1, ws2] = document["hosts"]
    [deployment] = ws1["deployments"]
    assert deployment["verdict"] == "fits" and deployment["margin_bytes"] > 0 and len(deployment["plan_digest"]) == 64
    assert ws1["devices"][0]["planned_bytes"] == ws1["devices"][0]["uses"][0]["bytes"] > 0
    assert [change["action"] for change in document["drift"]] == ["add", "add"]
    assert document["summary"]["drift"] == "Plan: 2 to add, 0 to change, 0 to remove."


def _finding_at(output: str, code: str) -> str:
    return next(line for line in output.splitlines() if f": {code} " in line)


def test_bad_placement_each_get_a_located_finding(world: World) -> None:
    outside = write(world.root.parent / "elsewhere" / "hybrid.toml", (world.root / "manifests" / "hybrid.toml")
                    .read_text().replace("../artifacts/", f"{world.root}/artifacts/"))
    fleet = world.fleet(TWO_HOSTS, CLEAN + f'''
[[deployments]]
host = "ws-9"
manifest = "manifests/dense.toml"
profile = "profiles/ngram.toml"

[[deployments]]
host = "ws-2"
device = 3
name = "second"
manifest = "manifests/dense.toml"
profile = "profiles/ngram.toml"

[[deployments]]
host = "ws-1"
name = "hybrid"
manifest = "manifests/dense.toml"
profile = "profiles/ngram.toml"

[[deployments]]
host = "ws-2"
name = "outside"
manifest = "../elsewhere/{outside.name}"
profile = "profiles/balanced.toml"
''')
    result = review(fleet)
    assert result.exit_code == 1
    text = fleet.read_text().splitlines()
    unknown = _finding_at(result.output, "PWR060")
    line = int(unknown.split(":")[1])
    assert text[line - 1] == 'host = "ws-9"' and "ws-9" in unknown
    assert "hint: did you mean 'ws-" in result.output
    assert "there is no device 3" in result.output
    duplicate = _finding_at(result.output, "PWR066")
    assert "ws-1/hybrid is declared twice" in duplicate
    outside_line = _finding_at(result.output, "PWR061")
    assert "[warning]" in outside_line and text[int(outside_line.split(":")[1]) - 1].startswith(
        'manifest = "../elsewhere/'
    )
    assert "ws-2/outside" in result.output  # planned anyway: allowed, only shown


def _planned_bytes(fleet: Path) -> int:
    document = json.loads(review(fleet, "--json").output)
    return document["hosts"][0]["devices"][0]["planned_bytes"]


def test_two_deployments_that_do_not_fit_one_device_together(world: World) -> None:
    one = world.fleet(TWO_HOSTS, CLEAN)
    single = _planned_bytes(one)
    shared_host = f'''
[[hosts]]
name = "small"
devices = [{{ model = "test card", vram = {int(single * 1.5) + 512 * 1024**2} }}]
'''
    both = '''
[[deployments]]
host = "small"
name = "a"
manifest = "manifests/hybrid.toml"
profile = "profiles/balanced.toml"

[[deployments]]
host = "small"
name = "b"
manifest = "manifests/hybrid.toml"
profile = "profiles/balanced.toml"
'''
    result = review(world.fleet(shared_host, both))
    assert result.exit_code == 1
    finding = _finding_at(result.output, "PWR062")
    assert "small device 0" in finding and "small/a" in finding and "small/b" in finding
    assert "hint: move one deployment" in result.output
    roomy = review(world.fleet(shared_host + TWO_HOSTS, both))
    assert "hint: small/b (" in roomy.output and "fits as planned on ws-1 device 0, ws-2 device 0" in roomy.output
    alone = review(world.fleet(shared_host, both.split("[[deployments]]")[1].join(["[[deployments]]", ""])))
    assert alone.exit_code == 0, alone.output


def test_drift_against_the_lock_like_terraform_plan(world: World) -> None:
    fleet = world.fleet(TWO_HOSTS, CLEAN)
    recorded = review(fleet, "--write-lock")
    assert recorded.exit_code == 0 and world.lock.exists()
    clean = review(fleet, "--detailed-exitcode")
    assert clean.exit_code == 0 and "No changes. The fleet matches the lock." in clean.output
    changed = CLEAN.replace("profiles/balanced.toml", "profiles/guarded.toml").replace('traffic = "echo"\n', "")
    changed += '''
[[deployments]]
host = "ws-2"
name = "more"
manifest = "manifests/hybrid.toml"
profile = "profiles/balanced.toml"
'''
    drifted = review(world.fleet(TWO_HOSTS, changed), "--detailed-exitcode")
    assert drifted.exit_code == 3, drifted.output
    assert "  ~ ws-1/hybrid will change" in drifted.output
    assert '      ~ profile: "balanced" -> "guarded"' in drifted.output
    assert '      ~ rollback: "full" -> "guarded"' in drifted.output
    assert "      ~ s: 7 -> 6" in drifted.output
    assert '      ~ traffic: "echo" -> "prose"' in drifted.output
    assert "  + ws-2/more will be added" in drifted.output
    assert "Plan: 1 to add, 2 to change, 0 to remove." in drifted.output
    assert review(world.fleet(TWO_HOSTS, changed)).exit_code == 0  # drift alone is not a failure
    removed = review(world.fleet(TWO_HOSTS, CLEAN.split("[[deployments]]")[1].join(["[[deployments]]", ""])))
    assert "  - ws-2/dense will be removed" in removed.output


def test_a_hand_edited_or_newer_lock_is_a_located_finding_and_never_overwritten(world: World) -> None:
    fleet = world.fleet(TWO_HOSTS, CLEAN)
    assert review(fleet, "--write-lock").exit_code == 0
    edited = world.lock.read_text().replace('"k": 7', '"k": 3', 1)
    world.lock.write_text(edited)
    result = review(fleet, "--write-lock")
    assert result.exit_code == 1
    finding = _finding_at(result.output, "PWR064")
    assert finding.startswith(f"{world.lock}:") and "edited by hand" in finding
    assert world.lock.read_text() == edited
    newer = edited.replace("power.fleet-lock/v2", "power.fleet-lock/v7")
    world.lock.write_text(newer)
    result = review(fleet)
    assert result.exit_code == 1 and f"{world.lock}:2:" in _finding_at(result.output, "PWR063")


def test_the_summary_counts_in_words_that_agree_with_the_count(world: World) -> None:
    """Issue 40 (low): "1 errors"."""
    one = CLEAN.replace('host = "ws-2"', 'host = "ws-3"', 1)
    result = review(world.fleet(TWO_HOSTS, one))
    assert result.exit_code == 1 and "2 hosts, 2 deployments: 1 error, 1 warning" in result.output, result.output


def test_findings_name_their_files_one_way(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 40 (low): the fleet file's findings were relative as given, its profiles' absolute (resolved)."""
    world.fleet(TWO_HOSTS, CLEAN.replace("profiles/balanced.toml", "profiles/guarded.toml").replace('host = "ws-2"',
                                                                                               'host = "ws-9"'))
    monkeypatch.chdir(world.root)
    result = review("fleet.toml")
    located = [line.split(":", 1)[0] for line in result.output.splitlines() if ": PWR" in line]
    assert "fleet.toml" in located and "profiles/guarded.toml" in located, result.output
    assert not any(Path(name).is_absolute() for name in located), located


def test_another_fleets_lock_is_refused_and_never_rewritten(world: World) -> None:
    """Issue 40.1: two fleets in one folder shared fleet.lock, and the second's --write-lock removed the first's plans
    and rollout history. A lock names its fleet; every command refuses another fleet's, leaving it byte for byte."""
    lab = world.fleet(TWO_HOSTS, CLEAN)
    assert review(lab, "--write-lock").exit_code == 0
    assert CliRunner().invoke(main, ["rollout", "plan", str(lab), "--deployments", "ws-1/*", "--profile",
                                     str(world.root / "profiles" / "guarded.toml")]).exit_code == 0
    written = world.lock.read_bytes()
    other = write(world.root / "other.toml", lab.read_text().replace('name = "lab"', 'name = "cpu-lab"', 1)
                  .split("[[deployments]]")[0] + CLEAN.split("[[deployments]]", 2)[2].join(["[[deployments]]", ""]))
    refusals = [review(other, "--write-lock"), review(other, "--detailed-exitcode")] + [
        CliRunner().invoke(main, ["rollout", *command, str(other)]) for command in
        (["plan", "--profile", str(world.root / "profiles" / "ngram.toml")], ["status", "--export-plans",
                                                                           str(world.root / "plans")],
         ["advance"], ["rollback"])]
    for result in refusals:
        assert result.exit_code == 1, result.output
        finding = _finding_at(result.output, "PWR083")
        assert finding.startswith(f"{world.lock}:3:") and "belongs to fleet 'lab', not 'cpu-lab'" in finding
        assert "--lock" in result.output
        assert "will be removed" not in result.output
    assert world.lock.read_bytes() == written and not (world.root / "plans").exists()
    own = world.root / "cpu-lab.lock"
    assert review(other, "--write-lock", "--lock", own).exit_code == 0 and own.is_file()
    unnamed = write(world.root / "unnamed.toml", other.read_text().replace('name = "cpu-lab"\n', "", 1))
    result = review(unnamed, "--lock", own)
    assert result.exit_code == 1 and "belongs to fleet 'cpu-lab', not 'unnamed'" in result.output


def test_a_missing_manifest_is_reported_at_the_fleet_line_that_names_it(world: World) -> None:
    fleet = world.fleet(TWO_HOSTS, CLEAN.replace("manifests/dense.toml", "manifests/dense-old.toml"))
    result = review(fleet)
    assert result.exit_code == 1
    finding = _finding_at(result.output, "PWR001")
    line = int(finding.split(":")[1])
    assert fleet.read_text().splitlines()[line - 1] == 'manifest = "manifests/dense-old.toml"'
    assert "ws-1/hybrid" in result.output  # the rest of the fleet is still reviewed


def test_a_fleet_that_does_not_load_and_a_missing_path(world: World) -> None:
    broken = write(world.root / "broken.toml", 'schema = "power.fleet/v1"\nhosts = []\n')
    result = review(broken)
    assert result.exit_code == 1 and "PWR0" in result.output
    assert review(world.root / "nope.toml").exit_code == 2


def test_each_artifact_is_read_and_hashed_once_per_review(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = _counting(monkeypatch, "inspect_artifact")
    hashes = _counting(monkeypatch, "sha256_file")
    hosts = "".join(f'[[hosts]]\nname = "h{n}"\ndevices = [{{ model = "RTX 4090", vram = "{24 + n % 3} GiB" }}]\n'
                    for n in range(30))
    deployments = "".join(f'[[deployments]]\nhost = "h{n}"\nmanifest = "manifests/{("dense", "hybrid")[n % 2]}.toml"\n'
                          f'profile = "profiles/{("ngram", "balanced")[n % 2]}.toml"\n' for n in range(30))
    result = review(world.fleet(hosts, deployments))
    assert result.exit_code == 0, result.output
    assert "30 hosts, 30 deployments: 0 errors" in result.output
    assert sorted(Path(path).name for path in reads) == ["dense-target.gguf", "hybrid-target.gguf"]
    assert sorted(Path(path).name for path in hashes) == ["dense-target.gguf", "hybrid-target.gguf"]


def _counting(monkeypatch: pytest.MonkeyPatch, name: str) -> list[str]:
    """Record each call the compiler makes to its real `name` (the artifact reader or the hasher)."""
    calls: list[str] = []
    real = getattr(compiler, name)

    def counted(path):
        calls.append(str(path))
        return real(path)

    monkeypatch.setattr(compiler, name, counted)
    return calls


def test_the_example_fleet_files_stay_valid_but_for_the_deliberate_typo() -> None:
    """fleet.toml names host 'ws-03' on purpose (README.md step 2); validate reports it from the file alone."""
    example = Path(__file__).resolve().parent.parent / "examples" / "fleet"
    result = CliRunner().invoke(main, ["validate", str(example)])
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if "[error]" in line]
    assert len(errors) == 1 and errors[0].startswith(f"{example / 'fleet.toml'}:96:8: PWR060"), errors
