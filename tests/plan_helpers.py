"""Shared by the plan-compiler tests: manifests and profiles over the factory's fixtures, and one compile call."""

from __future__ import annotations

import textwrap
from functools import cache
from pathlib import Path

from gguf_helpers import fixtures

from power.artifacts.digests import sha256_file
from power.documents.plan import ResolvedPlan
from power.findings import Finding
from power.orchestrator.inputs.loading import load_manifest, load_profile
from power.orchestrator.inputs.schema import DeviceSpec, HostSpec
from power.orchestrator.planning.compile import compile_plan


@cache
def digest(path: Path) -> str:
    return sha256_file(path, progress=False)


def fixture(name: str) -> Path:
    return fixtures()[name]


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return f'"{value}"'


def write_manifest(directory: Path, target: str, drafters: list[dict] = (), name: str = "test", hashed: bool = True,
                   **target_keys) -> Path:
    """A manifest for fixture `target`; each drafter dict names `kind` and, for file kinds, `fixture`.

    hashed=False declares placeholder digests (enough for `power size`, which reads headers only).
    """
    def sha(path: Path) -> str:
        return digest(path) if hashed else "0" * 64

    target_path = fixture(target)
    target_table = {"path": str(target_path), "sha256": sha(target_path)} | target_keys
    lines = ['schema = "power.manifest/v1"', f'name = "{name}"', "[target]"]
    lines += [f"{key} = {toml_value(value)}" for key, value in target_table.items() if value is not None]
    for drafter in drafters:
        lines += ["[[drafters]]", f'kind = "{drafter["kind"]}"']
        if "fixture" in drafter:
            path = fixture(drafter["fixture"])
            entry = {"path": str(path), "sha256": sha(path), "target_sha256": sha(target_path)}
            entry |= {k: v for k, v in drafter.items() if k not in ("kind", "fixture")}
            lines += [f"{key} = {toml_value(value)}" for key, value in entry.items()]
    path = Path(directory) / f"{name}.manifest.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_profile(directory: Path, mode: str, k: int = 3, s: int = 3, name: str = "test", runtime: dict | None = None,
                  **settings) -> Path:
    lines = ['schema = "power.profile/v1"', f'name = "{name}"', f'spec_mode = "{mode}"',
             f"spec_draft_max = {k}", f"spec_mtp_recurrent_snapshots = {s}"]
    lines += [f"{key} = {toml_value(value)}" for key, value in settings.items()]
    lines += ["[runtime]"] + [f"{key} = {toml_value(value)}" for key,
                              value in ({"ctx": 1024} | (runtime or {})).items()]
    path = Path(directory) / f"{name}.profile.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def host(vram: int = 24 << 30, headroom: int = 512 << 20) -> HostSpec:
    return HostSpec(name="test", devices=[DeviceSpec(model="test device", vram=vram)], headroom=headroom)


def compiled(manifest: Path, profile: Path, vram: int = 24 << 30, headroom: int = 512 << 20,
             engine: str = "power") -> tuple[ResolvedPlan | None, list[Finding]]:
    return compile_plan(load_manifest(manifest), load_profile(profile), host(vram, headroom), engine=engine)


def codes(findings: list[Finding]) -> list[str]:
    return [f.code for f in findings]


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")
