"""An artifact against the sha256 its plan was sealed with: every byte hashed, never an answer from the cache.

Where a plan launches (run, serve, bench) or is verified (`power verify`), each
file it names is checked here: a file whose size differs from the planned size
fails before it is read; otherwise it is hashed in full
(`power.artifacts.digests.sha256_file(use_cache=False)`), so neither a restored
mtime nor a stale cache entry can stand in for the bytes. `render` checks the
sha256 too, through the digest cache (`cached_sha256`: an entry stands only for
the unchanged file, by device, inode, size, mtime and ctime), so that a render
stays fast and a file changed since it was hashed is refused; `power verify`
stays the gate before a rendered engine starts (the Kubernetes render runs it in
the pod's init container).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from power.artifacts.digests import hash_regions, sha256_file
from power.artifacts.gguf_reader import ArtifactError

__all__ = ["Artifact", "ArtifactError", "cached_sha256", "present", "verified_regions", "verified_sha256"]

TARGET = "target"


@dataclass(frozen=True)
class Artifact:
    """A file a workload names, with what it must be (None: anything, for a plan-less run)."""

    role: str  # TARGET or the drafter's kind
    path: Path
    sha256: str | None
    size: int | None = None
    source: str | None = None  # where it is published (`power.documents.plan.Source.label`), when the plan says

    @property
    def label(self) -> str:
        return TARGET if self.role == TARGET else f"{self.role} drafter"


def verified_sha256(artifact: Artifact) -> str:
    """The artifact's sha256 over every byte; ArtifactError (PWR110, PWR10x, PWR115) when it is not the planned file.

    For a gate that only checks (verify); whatever loads the artifact uses `verified_regions`."""
    present(artifact)
    return _checked(artifact, sha256_file(artifact.path,
                                          use_cache=False))  # a progress bar on a terminal for large files


def verified_regions(artifact: Artifact, fd: int, size: int,
                     regions: Sequence[tuple[int, int]]) -> tuple[str, list[bytes]]:
    """The open artifact's sha256, checked against the plan (PWR115), and the sha256 of each (offset, length) region
    of the same read: a loader copies each region into place later and checks its copy against that digest, so the
    bytes it runs are the bytes verified here, without a copy of the whole file."""
    actual, digests = hash_regions(fd, size, str(artifact.path), regions)
    return _checked(artifact, actual), digests


def cached_sha256(artifact: Artifact) -> str:
    """The artifact's sha256 checked against the plan, from the digest cache when its entry is for the file as it
    is now (else hashed in full, and cached): what `render` checks."""
    present(artifact)
    return _checked(artifact, sha256_file(artifact.path))


def present(artifact: Artifact) -> None:
    """The file is there at its planned size (ArtifactError PWR110, PWR115), read no further."""
    path = str(artifact.path)
    if not os.path.exists(path):
        raise ArtifactError(f"the {artifact.label} artifact does not exist", code="PWR110", file=path,
                            hint="restore the planned file there, or fix the path and re-plan")
    if artifact.size is not None and os.path.isfile(path) and (size := os.path.getsize(path)) != artifact.size:
        raise _changed(artifact, f"is {size:,} bytes, the plan expects {artifact.size:,} (so its sha256 cannot match)")


def _checked(artifact: Artifact, actual: str) -> str:
    if artifact.sha256 is not None and actual != artifact.sha256:
        raise _changed(artifact, f"has sha256 {actual[:16]}..., the plan expects {artifact.sha256[:16]}...")
    return actual


def _changed(artifact: Artifact, what: str) -> ArtifactError:
    return ArtifactError(f"the {artifact.label} {what}: it is not the file the plan was compiled with", code="PWR115",
                         file=str(artifact.path), hint="restore the planned file, or re-plan with this one")
