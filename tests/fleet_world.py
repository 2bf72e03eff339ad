"""A small fleet world in a tmp directory: generated GGUFs, manifests, profiles and fleet files
(for the fleet tests)."""

from __future__ import annotations

import hashlib
import textwrap
from dataclasses import dataclass
from pathlib import Path

from power.artifacts.factory import build_dense_target, build_hybrid_target


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def kubernetes_host(path: Path) -> Path:
    """A host file at `path`: one 24 GiB GPU on Kubernetes node gpu-1, with an image for Power's runtime."""
    return write(path, '''
        schema = "power.host/v1"
        name = "gpu-1"
        devices = [{ model = "RTX 4090", vram = "24 GiB" }]
        [kubernetes]
        node_name = "gpu-1"
        images = { power = "registry.example.com/power:1" }
        ''')


@dataclass
class World:
    root: Path

    def fleet(self, hosts: str, deployments: str, name: str = "fleet.toml") -> Path:
        return write(self.root / name, 'schema = "power.fleet/v1"\nname = "lab"\n\n' + textwrap.dedent(hosts)
                     + "\n" + textwrap.dedent(deployments))

    @property
    def lock(self) -> Path:
        return self.root / "fleet.lock"


def build_world(root: Path) -> World:
    """Two small real targets (dense with ngram, hybrid with a native MTP head) and four profiles."""
    artifacts = root / "artifacts"
    artifacts.mkdir(parents=True)
    dense, hybrid = build_dense_target(artifacts), build_hybrid_target(artifacts)
    write(root / "manifests" / "dense.toml", f'''
        schema = "power.manifest/v1"
        name = "dense"
        [target]
        path = "../artifacts/{dense.name}"
        sha256 = "{sha256(dense)}"
        [[drafters]]
        kind = "ngram"
        ''')
    write(root / "manifests" / "hybrid.toml", f'''
        schema = "power.manifest/v1"
        name = "hybrid"
        [target]
        path = "../artifacts/{hybrid.name}"
        sha256 = "{sha256(hybrid)}"
        [[drafters]]
        kind = "mtp"
        ''')
    for name, mode, k, s in (("balanced", "mtp", 7, 7), ("guarded", "mtp", 7, 6), ("ngram", "ngram", 4, 4),
                             ("target-only", "none", 1, 1)):
        write(root / "profiles" / f"{name}.toml", f'''
            schema = "power.profile/v1"
            name = "{name}"
            spec_mode = "{mode}"
            spec_draft_max = {k}
            spec_mtp_recurrent_snapshots = {s}
            [runtime]
            ctx = 2048
            ''')
    return World(root)
