"""`power fleet report`: one self-contained HTML page, loaded in headless Chromium (or parsed, where there is none)."""

from __future__ import annotations

import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner
from fleet_world import World, build_world

from power.app.cli import main
from power.orchestrator.fleet.report import BAR_WIDTH

pytestmark = pytest.mark.browser  # outside `scripts/test --fast`: loads the report in headless Chromium where installed

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")


class Element:
    def __init__(self, tag: str, attrs: dict[str, str], parent: Element | None) -> None:
        self.tag, self.attrs, self.parent, self.children, self.text = tag, attrs, parent, [], ""

    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def find_all(self, tag: str, cls: str | None = None) -> list[Element]:
        found = []
        for child in self.children:
            if child.tag == tag and (cls is None or cls in child.classes()):
                found.append(child)
            found += child.find_all(tag, cls)
        return found

    def all_text(self) -> str:
        return self.text + "".join(child.all_text() for child in self.children)


class Tree(HTMLParser):
    VOID = {"meta", "br", "img", "link", "input", "hr"}

    def __init__(self) -> None:
        super().__init__()
        self.root = Element("#document", {}, None)
        self.current = self.root

    def handle_starttag(self, tag, attrs):
        element = Element(tag, {k: v or "" for k, v in attrs}, self.current)
        self.current.children.append(element)
        if tag not in self.VOID:
            self.current = element

    def handle_startendtag(self, tag, attrs):
        self.current.children.append(Element(tag, {k: v or "" for k, v in attrs}, self.current))

    def handle_endtag(self, tag):
        node = self.current
        while node is not self.root and node.tag != tag:
            node = node.parent
        if node is not self.root:
            self.current = node.parent

    def handle_data(self, data):
        self.current.text += data


def rendered_dom(page: Path, profile_dir: Path) -> str:
    """The DOM after Chromium loaded the page; the page's own text where Chromium is not installed."""
    chromium = shutil.which("chromium")
    if chromium is None:
        return page.read_text()
    result = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile_dir}", "--dump-dom", page.as_uri()],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.fixture()
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    monkeypatch.setenv("POWER_CACHE_DIR", str(tmp_path / "cache"))
    return build_world(tmp_path / "world")


def _overcommitted_fleet(world: World) -> Path:
    single = world.fleet('[[hosts]]\nname = "probe"\ndevices = [{ model = "x", vram = "24 GiB" }]\n',
                         '[[deployments]]\nhost = "probe"\nmanifest = "manifests/hybrid.toml"\nprofile = '
                         '"profiles/balanced.toml"\n',
                         name="probe.toml")
    probe = json.loads(CliRunner().invoke(main, ["fleet", "review", str(single), "--json"]).output)
    one_plan = probe["hosts"][0]["devices"][0]["planned_bytes"]
    hosts = f'''
[[hosts]]
name = "small"
devices = [{{ model = "test card", vram = {int(one_plan * 1.5)} }}]
headroom = 0
labels = {{ note = "<b>not markup</b>" }}

[[hosts]]
name = "ws-2"
devices = [{{ model = "RTX 6000 Ada", vram = "48 GiB" }}, {{ model = "RTX 4090", vram = "24 GiB" }}]
'''
    deployments = "".join(f'''
[[deployments]]
host = "{host}"
name = "{name}"
manifest = "manifests/{manifest}.toml"
profile = "profiles/{profile}.toml"
''' for host, name, manifest, profile in (("small", "a", "hybrid", "balanced"), ("small", "b", "hybrid", "balanced"),
                                          ("ws-2", "dense", "dense", "ngram"), ("nowhere", "lost", "dense", "ngram")))
    return world.fleet(hosts, deployments)


def test_the_report_loads_in_a_browser_with_bars_findings_and_drift(world: World, tmp_path: Path) -> None:
    fleet = _overcommitted_fleet(world)
    page = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["fleet", "report", str(fleet), "-o", str(page)])
    assert result.exit_code == 1, result.output  # written, and the errors it shows fail CI
    html = page.read_text()
    assert "<script" not in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    tree = Tree()
    tree.feed(rendered_dom(page, tmp_path / "chromium-profile"))
    document = tree.root

    hosts = {section.attrs["id"]: section for section in document.find_all("section", "host")}
    assert set(hosts) == {"host-small", "host-ws-2"}
    assert "<b>not markup</b>" in hosts["host-small"].find_all("h2")[0].all_text()
    assert not hosts["host-small"].find_all("b")

    [small_bar] = hosts["host-small"].find_all("svg", "vram-bar")
    deployments = small_bar.find_all("rect", "deployment")
    [overflow] = small_bar.find_all("rect", "overflow")
    assert len(deployments) == 2
    assert sum(float(rect.attrs["width"]) for rect in deployments) == pytest.approx(BAR_WIDTH, abs=0.5)
    assert float(overflow.attrs["x"]) + float(overflow.attrs["width"]) == pytest.approx(BAR_WIDTH, abs=0.5)
    assert "over the device by" in overflow.all_text()
    assert len(hosts["host-ws-2"].find_all("svg", "vram-bar")) == 2  # one bar per device
    assert not hosts["host-ws-2"].find_all("rect", "overflow")

    rows = [[cell.all_text().strip() for cell in row.find_all("td")] for row in document.find_all("tr", "deployment")]
    assert [rows[0][i] for i in (0, 1, 2, 4, 5, 6, 7)] == ["small/a", "0", "fits", "mtp", "K7/S7", "full", "prose"]
    assert rows[0][3].endswith("iB")
    findings = " ".join(item.all_text() for item in document.find_all("li", "finding"))
    assert "PWR062" in findings and "PWR060" in findings and "nowhere" in findings
    [drift] = document.find_all("pre", "drift")
    assert "+ small/a will be added" in drift.all_text() and "Plan: 3 to add" in drift.all_text()


def test_a_fleet_that_does_not_load_writes_no_report(world: World, tmp_path: Path) -> None:
    broken = world.root / "broken.toml"
    broken.write_text('schema = "power.fleet/v1"\nhosts = "none"\n')
    page = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["fleet", "report", str(broken), "-o", str(page)])
    assert result.exit_code == 1 and not page.exists()


def test_a_deployment_without_a_plan_is_drawn_as_a_failure(world: World, tmp_path: Path) -> None:
    """Defect 12: a deployment the review could not plan was drawn as an empty bar, as if its device were free."""
    fleet = world.fleet('[[hosts]]\nname = "tiny"\ndevices = [{ model = "x", vram = "1 MiB" }]\nheadroom = 0\n',
                        '[[deployments]]\nhost = "tiny"\nname = "dense"\nengine = "power"\n'
                        'manifest = "manifests/dense.toml"\nprofile = "profiles/ngram.toml"\n', name="tiny.toml")
    page = tmp_path / "report.html"
    assert CliRunner().invoke(main, ["fleet", "report", str(fleet), "-o", str(page)]).exit_code == 1
    tree = Tree()
    tree.feed(rendered_dom(page, tmp_path / "chromium-profile"))
    [bar] = tree.root.find_all("svg", "vram-bar")
    [failed] = bar.find_all("rect", "no-plan")
    assert float(failed.attrs["width"]) == BAR_WIDTH and "tiny/dense: no plan" in failed.all_text()
    [caption] = tree.root.find_all("figcaption")
    assert "no plan: tiny/dense" in caption.all_text()
