"""Review a generated 1,000-host fleet over 20 artifacts; report the time, and the ratio to
planning each deployment alone.

    python bench/bench_fleet.py [--hosts 1000] [--artifacts 20] [--naive 1000]

Artifacts are the factory's small real targets (dense with n-gram, hybrid with a
native MTP head), one copy per artifact directory, so each is a separate file to
read and hash. Hosts cycle through a 24 GiB, a 48 GiB and a 141 GB device; each
runs one deployment. Side by side in one run:

- shared memo: `review_fleet` (each manifest/profile loaded once, each artifact read
  and hashed once, each distinct plan compiled once), with a cold digest cache;
- per deployment: the same deployments, each loaded and compiled from scratch (a new
  artifact memo each time; the on-disk digest cache is warm, so this baseline is
  kinder than a truly naive review).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
from pathlib import Path

from power.artifacts.factory import build_dense_target, build_hybrid_target
from power.orchestrator.fleet.review import review_fleet
from power.orchestrator.inputs.loading import load_fleet, load_manifest, load_profile
from power.orchestrator.planning.compile import ArtifactMemo, compile_plan

DEVICES = ('{ model = "RTX 4090", vram = "24 GiB" }', '{ model = "RTX 6000 Ada", vram = "48 GiB" }',
           '{ model = "H200", vram = "141 GB" }')
PROFILES = {"dense": ("ngram", "target-only"), "hybrid": ("balanced", "guarded")}
PROFILE_SETTINGS = {"ngram": ("ngram", 4, 4), "target-only": ("none", 1, 1), "balanced": ("mtp", 7, 7),
                    "guarded": ("mtp", 7, 6)}


def build_fleet(root: Path, hosts: int, artifacts: int) -> Path:
    for name, (mode, k, s) in PROFILE_SETTINGS.items():
        (root / f"{name}.toml").write_text(f'schema = "power.profile/v1"\nname = "{name}"\nspec_mode = "{mode}"\n'
                                           f"spec_draft_max = {k}\nspec_mtp_recurrent_snapshots = {s}\n")
    manifests = []
    for index in range(artifacts):
        kind = "dense" if index % 2 == 0 else "hybrid"
        directory = root / f"artifact-{index:02d}"
        directory.mkdir()
        path = (build_dense_target if kind == "dense" else build_hybrid_target)(directory)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        drafter = "ngram" if kind == "dense" else "mtp"
        manifest = root / f"m{index:02d}.toml"
        manifest.write_text(f'schema = "power.manifest/v1"\nname = "m{index:02d}"\n[target]\n'
                            f'path = "{path.relative_to(root)}"\nsha256 = '
                            f'"{digest}"\n[[drafters]]\nkind = "{drafter}"\n')
        manifests.append((manifest.name, kind))
    lines = ['schema = "power.fleet/v1"', 'name = "generated"']
    for host in range(hosts):
        lines += ["[[hosts]]", f'name = "h{host:04d}"', f"devices = [{DEVICES[host % len(DEVICES)]}]"]
    for host in range(hosts):
        manifest, kind = manifests[host % artifacts]
        profile = PROFILES[kind][(host // artifacts) % 2]
        lines += ["[[deployments]]", f'host = "h{host:04d}"', f'manifest = "{manifest}"', f'profile = "{profile}.toml"']
    fleet = root / "fleet.toml"
    fleet.write_text("\n".join(lines) + "\n")
    return fleet


def per_deployment(fleet_path: Path, limit: int) -> tuple[float, int]:
    fleet = load_fleet(fleet_path).model
    hosts = {host.name: host for host in fleet.hosts}
    start = time.perf_counter()
    for deployment in fleet.deployments[:limit]:
        plan, _ = compile_plan(load_manifest(deployment.manifest), load_profile(deployment.profile),
                               hosts[deployment.host], deployment.device_indices, ArtifactMemo(),
                               engine=deployment.engine)
        assert plan is not None
    return time.perf_counter() - start, min(limit, len(fleet.deployments))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--artifacts", type=int, default=20)
    parser.add_argument("--naive", type=int, default=1000, help="deployments planned one by one for the baseline")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["POWER_CACHE_DIR"] = str(root / "digest-cache")
        fleet = build_fleet(root, args.hosts, args.artifacts)
        start = time.perf_counter()
        review = review_fleet(fleet)
        shared = time.perf_counter() - start
        assert not review.has_errors, [f.render() for f in review.all_findings][:3]
        planned = len(review.records())
        naive, count = per_deployment(fleet, args.naive)
    per_shared, per_naive = shared / planned, naive / count
    print(f"fleet: {args.hosts} hosts, {planned} deployments planned, {args.artifacts} artifacts, "
          f"{len(review.plans())} distinct plans")
    print(f"shared memo review : {shared:8.2f} s  ({per_shared * 1000:7.2f} ms per deployment, cold digest cache)")
    print(f"per deployment     : {naive:8.2f} s  ({per_naive * 1000:7.2f} ms per deployment, {count} planned alone)")
    print(f"ratio              : {per_naive / per_shared:8.1f}x faster per deployment with the shared memo")


if __name__ == "__main__":
    main()
